//! The two generations of the Iggy protocol.

use serde::{Deserialize, Serialize};

/// A generation of the Iggy protocol: what a server speaks and what an SDK must speak to it.
/// The two are not wire-compatible in either direction, so every cluster names its own
/// (`clusters.<alias>.iggy_version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum IggyVersion {
    /// Iggy server 0.8 (SDK 0.10): length-prefixed frames.
    #[default]
    V0_8,
    /// Iggy server 0.9, "server-ng" (SDK 0.11): 256-byte consensus headers.
    V0_9,
}

impl IggyVersion {
    /// Both generations, oldest first.
    pub const ALL: [IggyVersion; 2] = [IggyVersion::V0_8, IggyVersion::V0_9];

    /// How configs and command lines spell it: `"0.8"` or `"0.9"`.
    pub fn as_str(self) -> &'static str {
        match self {
            IggyVersion::V0_8 => "0.8",
            IggyVersion::V0_9 => "0.9",
        }
    }
}

impl std::fmt::Display for IggyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for IggyVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IggyVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("unknown Iggy version {s:?} (expected \"0.8\" or \"0.9\")"))
    }
}

impl TryFrom<String> for IggyVersion {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<IggyVersion> for String {
    fn from(v: IggyVersion) -> Self {
        v.as_str().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_and_others_are_refused_with_the_choices() {
        for v in IggyVersion::ALL {
            assert_eq!(v.as_str().parse::<IggyVersion>(), Ok(v));
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(serde_json::from_str::<IggyVersion>(&json).unwrap(), v);
        }
        let err = "0.10".parse::<IggyVersion>().unwrap_err();
        assert!(err.contains("\"0.8\" or \"0.9\""), "{err}");
        assert!(serde_json::from_str::<IggyVersion>("\"9\"").is_err());
    }
}

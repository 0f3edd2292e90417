//! Values that must never reach a log: the cluster secret and Iggy URLs with credentials.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A secret string (cluster secret, admin token); prints as `****`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must send or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// An Iggy connection string (`iggy://user:password@host:port?options`) whose
/// password or token is masked when displayed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl(String);

impl ClusterUrl {
    /// Wraps a connection string (not validated here; see `Config::problems`).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The full connection string with credentials, for the SDK.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The connection string with its password or token replaced by `****`.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return "****".to_owned();
        };
        match rest.rsplit_once('@') {
            Some((credentials, address)) => match credentials.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:****@{address}"),
                None => format!("{scheme}://****@{address}"),
            },
            None => self.0.clone(),
        }
    }
}

impl fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for ClusterUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(ClusterUrl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints_its_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "**** ****");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn url_redacts_password_and_token() {
        let url = ClusterUrl::new("iggy://admin:s3cr3t@10.0.0.1:8090?nodelay=true");
        assert_eq!(
            url.to_string(),
            "iggy://admin:****@10.0.0.1:8090?nodelay=true"
        );
        assert!(!format!("{url:?}").contains("s3cr3t"));
        let pat = ClusterUrl::new("iggy+tcp://tok3n@host:8090");
        assert_eq!(pat.to_string(), "iggy+tcp://****@host:8090");
    }
}

//! Byte-level pieces of the Iggy TCP binary protocol: command codes, status codes, a bounds-checked
//! payload reader that fails exactly where `iggy_binary_protocol` 0.10.0 fails, and the encoders of
//! the response records. Layouts follow `iggy-protocol.md`, Part B.

/// Command codes (`iggy_binary_protocol::codes`).
pub(crate) mod command {
    pub(crate) const PING: u32 = 1;
    pub(crate) const GET_STATS: u32 = 10;
    pub(crate) const GET_SNAPSHOT_FILE: u32 = 11;
    pub(crate) const GET_CLUSTER_METADATA: u32 = 12;
    pub(crate) const GET_ME: u32 = 20;
    pub(crate) const GET_CLIENT: u32 = 21;
    pub(crate) const GET_CLIENTS: u32 = 22;
    pub(crate) const GET_USER: u32 = 31;
    pub(crate) const GET_USERS: u32 = 32;
    pub(crate) const CREATE_USER: u32 = 33;
    pub(crate) const DELETE_USER: u32 = 34;
    pub(crate) const UPDATE_USER: u32 = 35;
    pub(crate) const UPDATE_PERMISSIONS: u32 = 36;
    pub(crate) const CHANGE_PASSWORD: u32 = 37;
    pub(crate) const LOGIN_USER: u32 = 38;
    pub(crate) const LOGOUT_USER: u32 = 39;
    pub(crate) const GET_PERSONAL_ACCESS_TOKENS: u32 = 41;
    pub(crate) const DELETE_PERSONAL_ACCESS_TOKEN: u32 = 43;
    pub(crate) const LOGIN_WITH_PERSONAL_ACCESS_TOKEN: u32 = 44;
    pub(crate) const POLL_MESSAGES: u32 = 100;
    pub(crate) const SEND_MESSAGES: u32 = 101;
    pub(crate) const FLUSH_UNSAVED_BUFFER: u32 = 102;
    pub(crate) const GET_CONSUMER_OFFSET: u32 = 120;
    pub(crate) const STORE_CONSUMER_OFFSET: u32 = 121;
    pub(crate) const DELETE_CONSUMER_OFFSET: u32 = 122;
    pub(crate) const GET_STREAM: u32 = 200;
    pub(crate) const GET_STREAMS: u32 = 201;
    pub(crate) const CREATE_STREAM: u32 = 202;
    pub(crate) const DELETE_STREAM: u32 = 203;
    pub(crate) const UPDATE_STREAM: u32 = 204;
    pub(crate) const PURGE_STREAM: u32 = 205;
    pub(crate) const GET_TOPIC: u32 = 300;
    pub(crate) const GET_TOPICS: u32 = 301;
    pub(crate) const CREATE_TOPIC: u32 = 302;
    pub(crate) const DELETE_TOPIC: u32 = 303;
    pub(crate) const UPDATE_TOPIC: u32 = 304;
    pub(crate) const PURGE_TOPIC: u32 = 305;
    pub(crate) const CREATE_PARTITIONS: u32 = 402;
    pub(crate) const DELETE_PARTITIONS: u32 = 403;
    pub(crate) const DELETE_SEGMENTS: u32 = 503;
    pub(crate) const GET_CONSUMER_GROUP: u32 = 600;
    pub(crate) const GET_CONSUMER_GROUPS: u32 = 601;
    pub(crate) const CREATE_CONSUMER_GROUP: u32 = 602;
    pub(crate) const DELETE_CONSUMER_GROUP: u32 = 603;
    pub(crate) const JOIN_CONSUMER_GROUP: u32 = 604;
    pub(crate) const LEAVE_CONSUMER_GROUP: u32 = 605;
}

/// Response status codes (`IggyError::as_code()` of the variants the server answers with).
pub(crate) mod status {
    pub(crate) const INVALID_COMMAND: u32 = 3;
    pub(crate) const INVALID_FORMAT: u32 = 4;
    pub(crate) const FEATURE_UNAVAILABLE: u32 = 5;
    pub(crate) const INVALID_IDENTIFIER: u32 = 6;
    pub(crate) const RESOURCE_NOT_FOUND: u32 = 20;
    pub(crate) const UNAUTHENTICATED: u32 = 40;
    pub(crate) const UNAUTHORIZED: u32 = 41;
    pub(crate) const INVALID_CREDENTIALS: u32 = 42;
    pub(crate) const INVALID_USERNAME: u32 = 43;
    pub(crate) const INVALID_PASSWORD: u32 = 44;
    pub(crate) const USER_ALREADY_EXISTS: u32 = 46;
    pub(crate) const USER_INACTIVE: u32 = 47;
    pub(crate) const CANNOT_DELETE_USER: u32 = 48;
    pub(crate) const CANNOT_CHANGE_PERMISSIONS: u32 = 49;
    pub(crate) const CLIENT_NOT_FOUND: u32 = 100;
    pub(crate) const INVALID_CLIENT_ID: u32 = 101;
    pub(crate) const STREAM_ID_NOT_FOUND: u32 = 1009;
    pub(crate) const STREAM_NAME_ALREADY_EXISTS: u32 = 1012;
    pub(crate) const INVALID_TOPIC_SIZE: u32 = 1019;
    pub(crate) const TOPIC_ID_NOT_FOUND: u32 = 2010;
    pub(crate) const TOPIC_NAME_ALREADY_EXISTS: u32 = 2013;
    pub(crate) const TOO_MANY_PARTITIONS: u32 = 2015;
    pub(crate) const INVALID_PARTITIONS_COUNT: u32 = 2019;
    pub(crate) const PARTITION_NOT_FOUND: u32 = 3007;
    pub(crate) const CONSUMER_OFFSET_NOT_FOUND: u32 = 3021;
    pub(crate) const NOT_RESOLVED_CONSUMER: u32 = 3022;
    pub(crate) const INVALID_MESSAGES_COUNT: u32 = 4009;
    pub(crate) const TOO_BIG_USER_HEADERS: u32 = 4017;
    pub(crate) const TOO_BIG_MESSAGE_PAYLOAD: u32 = 4022;
    pub(crate) const NON_ZERO_OFFSET: u32 = 4031;
    pub(crate) const NON_ZERO_TIMESTAMP: u32 = 4032;
    pub(crate) const MISSING_INDEX: u32 = 4033;
    pub(crate) const INVALID_MESSAGES_SIZE: u32 = 4036;
    pub(crate) const INVALID_OFFSET: u32 = 4100;
    pub(crate) const CONSUMER_GROUP_ID_NOT_FOUND: u32 = 5000;
    pub(crate) const CONSUMER_GROUP_NAME_ALREADY_EXISTS: u32 = 5004;
    pub(crate) const CONSUMER_GROUP_MEMBER_NOT_FOUND: u32 = 5006;
    pub(crate) const CANNOT_READ_INDEX_POSITION: u32 = 10011;
}

/// Largest non-SEND payload the real server reads (`MAX_CONTROL_FRAME_PAYLOAD`, 10 MiB).
pub(crate) const MAX_CONTROL_FRAME_PAYLOAD: u32 = 10 * 1024 * 1024;
/// Size of the fixed message header (B5).
pub(crate) const MESSAGE_HEADER_SIZE: usize = 64;
/// Size of one SEND_MESSAGES index entry.
pub(crate) const INDEX_SIZE: usize = 16;
/// Largest payload a message may carry (`MAX_PAYLOAD_SIZE`).
pub(crate) const MAX_PAYLOAD_SIZE: usize = 64_000_000;
/// Largest user-header block a message may carry (`MAX_USER_HEADERS_SIZE`).
pub(crate) const MAX_USER_HEADERS_SIZE: usize = 100_000;

/// Why a payload failed to decode; mapped to a status exactly like the server's `decode()` does
/// (validation → `InvalidFormat`, everything else → `InvalidCommand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The payload ended early, or held bad UTF-8, or an unknown kind byte.
    Malformed,
    /// A structurally valid field broke a rule (name length, identifier length).
    Validation,
}

impl DecodeError {
    /// The status the real server answers for this failure.
    pub(crate) fn status(self) -> u32 {
        match self {
            DecodeError::Malformed => status::INVALID_COMMAND,
            DecodeError::Validation => status::INVALID_FORMAT,
        }
    }
}

/// A stream/topic/group identifier as sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ident<'a> {
    /// Kind 1: a slot id.
    Numeric(u32),
    /// Kind 2: an exact name.
    Name(&'a str),
}

/// Consumer kinds on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConsumerKind {
    /// Kind 1: a plain consumer keyed by its id.
    Consumer,
    /// Kind 2: a consumer group.
    Group,
}

/// A decoded `Consumer`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WireConsumer<'a> {
    /// Plain consumer or group.
    pub(crate) kind: ConsumerKind,
    /// Its identifier.
    pub(crate) id: Ident<'a>,
}

/// Polling strategy kinds (B2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Start at the given offset.
    Offset(u64),
    /// Start at the first message with timestamp ≥ value (µs).
    Timestamp(u64),
    /// Start at the oldest retained message.
    First,
    /// The last `count` messages.
    Last,
    /// Stored consumer offset + 1.
    Next,
}

/// Bounds-checked little-endian reader over a request payload.
pub(crate) struct Reader<'a> {
    /// The payload.
    buf: &'a [u8],
    /// Next byte to read.
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Malformed)?;
        let slice = self.buf.get(self.pos..end).ok_or(DecodeError::Malformed)?;
        self.pos = end;
        Ok(slice)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self, n: usize) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes(n)?).map_err(|_| DecodeError::Malformed)
    }

    /// `WireName`: u8 length 1..255 + UTF-8.
    pub(crate) fn name(&mut self) -> Result<&'a str, DecodeError> {
        let len = usize::from(self.u8()?);
        if len == 0 {
            return Err(DecodeError::Validation);
        }
        self.str(len)
    }

    /// A u8-length-prefixed string without the 1..255 rule (passwords).
    pub(crate) fn short_str(&mut self) -> Result<&'a str, DecodeError> {
        let len = usize::from(self.u8()?);
        self.str(len)
    }

    /// A u32-length-prefixed string (LOGIN_USER version and context).
    pub(crate) fn long_str(&mut self) -> Result<&'a str, DecodeError> {
        let len = self.u32()? as usize;
        self.str(len)
    }

    /// `WireIdentifier`: kind u8 + length u8 + value, validated like the protocol crate.
    pub(crate) fn ident(&mut self) -> Result<Ident<'a>, DecodeError> {
        let kind = self.u8()?;
        let len = usize::from(self.u8()?);
        let value = self.bytes(len)?;
        match kind {
            1 => {
                if len != 4 {
                    return Err(DecodeError::Validation);
                }
                Ok(Ident::Numeric(u32::from_le_bytes([
                    value[0], value[1], value[2], value[3],
                ])))
            }
            2 => {
                if len == 0 {
                    return Err(DecodeError::Validation);
                }
                let name = std::str::from_utf8(value).map_err(|_| DecodeError::Malformed)?;
                Ok(Ident::Name(name))
            }
            _ => Err(DecodeError::Malformed),
        }
    }

    /// `WireConsumer`: kind u8 (1 or 2) + identifier.
    pub(crate) fn consumer(&mut self) -> Result<WireConsumer<'a>, DecodeError> {
        let kind = match self.u8()? {
            1 => ConsumerKind::Consumer,
            2 => ConsumerKind::Group,
            _ => return Err(DecodeError::Malformed),
        };
        let id = self.ident()?;
        Ok(WireConsumer { kind, id })
    }

    /// Optional partition id: flag u8 (1 = present) + u32, always 5 bytes.
    pub(crate) fn optional_partition(&mut self) -> Result<Option<u32>, DecodeError> {
        let flag = self.u8()?;
        let value = self.u32()?;
        Ok((flag == 1).then_some(value))
    }

    /// `WirePollingStrategy`: kind u8 + value u64.
    pub(crate) fn strategy(&mut self) -> Result<Strategy, DecodeError> {
        let kind = self.u8()?;
        if !(1..=5).contains(&kind) {
            return Err(DecodeError::Malformed);
        }
        let value = self.u64()?;
        Ok(match kind {
            1 => Strategy::Offset(value),
            2 => Strategy::Timestamp(value),
            3 => Strategy::First,
            4 => Strategy::Last,
            _ => Strategy::Next,
        })
    }
}

/// Identifier parsing used by SEND_MESSAGES, which goes through `Identifier::from_raw_bytes` in
/// the real server and therefore answers `InvalidIdentifier` (6) instead of the decoder statuses.
pub(crate) fn send_ident(buf: &[u8]) -> Result<(Ident<'_>, usize), u32> {
    let kind = *buf.first().ok_or(status::INVALID_IDENTIFIER)?;
    if kind != 1 && kind != 2 {
        return Err(status::INVALID_IDENTIFIER);
    }
    let len = usize::from(*buf.get(1).ok_or(status::INVALID_IDENTIFIER)?);
    let value = buf.get(2..2 + len).ok_or(status::INVALID_IDENTIFIER)?;
    if len == 0 || (kind == 1 && len != 4) {
        return Err(status::INVALID_IDENTIFIER);
    }
    let ident = if kind == 1 {
        Ident::Numeric(u32::from_le_bytes([value[0], value[1], value[2], value[3]]))
    } else {
        // The real server keeps the raw bytes and compares them with names; bytes that are not
        // UTF-8 can never equal a stored name, which is what a NUL-free impossible name models.
        match std::str::from_utf8(value) {
            Ok(name) => Ident::Name(name),
            Err(_) => Ident::Name("\u{0}\u{0}invalid-utf8"),
        }
    };
    Ok((ident, 2 + len))
}

/// SEND_MESSAGES partitioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Partitioning<'a> {
    /// Kind 1: per-topic round robin.
    Balanced,
    /// Kind 2: an explicit partition id.
    PartitionId(u32),
    /// Kind 3: `XxHash32(key) % partitions_count`.
    MessagesKey(&'a [u8]),
}

/// `Partitioning::from_raw_bytes` of `iggy_common`: every failure is `InvalidCommand`.
pub(crate) fn send_partitioning(buf: &[u8]) -> Result<(Partitioning<'_>, usize), u32> {
    let kind = *buf.first().ok_or(status::INVALID_COMMAND)?;
    let len = usize::from(*buf.get(1).ok_or(status::INVALID_COMMAND)?);
    if !(1..=3).contains(&kind) || (kind == 2 && len != 4) || (kind == 1 && len != 0) {
        return Err(status::INVALID_COMMAND);
    }
    let value = buf.get(2..2 + len).ok_or(status::INVALID_COMMAND)?;
    let partitioning = match kind {
        1 => Partitioning::Balanced,
        2 => {
            Partitioning::PartitionId(u32::from_le_bytes([value[0], value[1], value[2], value[3]]))
        }
        _ => Partitioning::MessagesKey(value),
    };
    Ok((partitioning, 2 + len))
}

/// Appends little-endian integers and length-prefixed strings to a response buffer.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_f32(&mut self, v: f32);
    /// u8 length + bytes (names are validated to 1..255 bytes when stored).
    fn put_name(&mut self, s: &str);
    /// u32 length + bytes.
    fn put_long_str(&mut self, s: &str);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_f32(&mut self, v: f32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_name(&mut self, s: &str) {
        let len = u8::try_from(s.len()).unwrap_or(u8::MAX);
        self.push(len);
        self.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
    }
    fn put_long_str(&mut self, s: &str) {
        let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
        self.put_u32(len);
        self.extend_from_slice(s.as_bytes());
    }
}

/// Reads a little-endian u32 at `at` from a slice known to be long enough.
pub(crate) fn le_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

/// Reads a little-endian u64 at `at` from a slice known to be long enough.
pub(crate) fn le_u64(buf: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn ident_rejects_numeric_with_wrong_length_as_validation() {
        let mut r = Reader::new(&[1, 3, 0, 0, 0]);
        check!(r.ident() == Err(DecodeError::Validation));
    }

    #[test]
    fn ident_rejects_unknown_kind_as_malformed() {
        let mut r = Reader::new(&[9, 4, 0, 0, 0, 0]);
        check!(r.ident() == Err(DecodeError::Malformed));
    }

    #[test]
    fn ident_reads_name_and_number() {
        let mut r = Reader::new(&[2, 2, b's', b'1', 1, 4, 7, 0, 0, 0]);
        check!(r.ident() == Ok(Ident::Name("s1")));
        check!(r.ident() == Ok(Ident::Numeric(7)));
        check!(r.position() == 10);
    }

    #[test]
    fn short_payload_is_malformed() {
        let mut r = Reader::new(&[1, 2, 3]);
        check!(r.u32() == Err(DecodeError::Malformed));
    }

    #[test]
    fn empty_name_is_validation_error() {
        let mut r = Reader::new(&[0]);
        check!(r.name() == Err(DecodeError::Validation));
    }

    #[test]
    fn send_partitioning_checks_lengths() {
        check!(send_partitioning(&[1, 0]) == Ok((Partitioning::Balanced, 2)));
        check!(send_partitioning(&[1, 1, 0]) == Err(status::INVALID_COMMAND));
        check!(send_partitioning(&[2, 4, 3, 0, 0, 0]) == Ok((Partitioning::PartitionId(3), 6)));
        check!(send_partitioning(&[2, 3, 3, 0, 0]) == Err(status::INVALID_COMMAND));
        check!(send_partitioning(&[3, 1, 9]) == Ok((Partitioning::MessagesKey(&[9]), 3)));
        check!(send_partitioning(&[4, 0]) == Err(status::INVALID_COMMAND));
    }

    #[test]
    fn send_ident_answers_invalid_identifier() {
        check!(send_ident(&[1, 3, 0, 0, 0]) == Err(status::INVALID_IDENTIFIER));
        check!(send_ident(&[3, 1, 0]) == Err(status::INVALID_IDENTIFIER));
        check!(send_ident(&[2, 0]) == Err(status::INVALID_IDENTIFIER));
        check!(send_ident(&[1, 4, 5, 0, 0, 0]) == Ok((Ident::Numeric(5), 6)));
    }
}

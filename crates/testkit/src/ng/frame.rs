//! The frames of the 0.9 generation, without IO: every request and every answer starts with a
//! 256-byte consensus header (layouts from `iggy_binary_protocol` 0.11, the crate both the SDK
//! and the server build them with). A request names an *operation*: `Register` (a login),
//! `Logout`, `NonReplicated` (reads and PING, with the command code in the header's first
//! reserved bytes) or a replicated command. The server answers with a `Reply` header (a status,
//! then the body) or, when it ends the session, an `Eviction` header with a reason.
//!
//! Metadata writes and consumer-offset writes are *result framed*: the body starts with a result
//! section, `[count:u32]` then `count` entries `[index:u32][code:u32]`; success is count 0 then
//! the typed answer, a rejection of the command itself is one entry with its error code (the
//! header status stays 0). Denials before a command runs (no login, no right, a body that does
//! not match its checksum) travel in the header status with an empty body instead.

use bytemuck::checked::try_pod_read_unaligned;
use iggy09_binary_protocol::consensus::{
    Command, ConsensusHeader, EvictionHeader, EvictionReason, Operation, ReplyHeader,
    RequestHeader, HEADER_SIZE,
};
use iggy09_binary_protocol::{IGGY_PROTOCOL_VERSION, IGGY_PROTOCOL_VERSION_MIN};

/// Size of every request, reply and eviction header.
pub(crate) const HEADER: usize = HEADER_SIZE;

/// Where a non-replicated request carries its command code (`RequestHeader.reserved[0..4]`).
const CODE_RANGE: std::ops::Range<usize> = 0..4;

/// Largest request body accepted (the SDK's largest batch is far below); a bigger claimed size
/// ends the connection, as the server's message bus does with a frame it cannot take.
pub(crate) const MAX_BODY: usize = 64 * 1024 * 1024;

/// Why a request header cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Not a valid header (unknown command or operation byte), or not a `Request`: the server
    /// drops such a frame without an answer.
    Invalid,
    /// The size field is below the header size or above [`MAX_BODY`]: the stream cannot be
    /// followed any further.
    BadSize,
}

/// The size field of a header: where the next frame starts.
pub(crate) fn frame_size(header: &[u8; HEADER]) -> Result<usize, HeaderError> {
    let size = iggy09_binary_protocol::consensus::read_size_field(header)
        .ok_or(HeaderError::BadSize)? as usize;
    if size < HEADER || size - HEADER > MAX_BODY {
        return Err(HeaderError::BadSize);
    }
    Ok(size)
}

/// Decodes a request header.
pub(crate) fn request_header(header: &[u8; HEADER]) -> Result<RequestHeader, HeaderError> {
    let parsed: RequestHeader = try_pod_read_unaligned(header).map_err(|_| HeaderError::Invalid)?;
    // The server's own rules: a request names its client; a register carries session and
    // request 0; every other replicated operation a session and a request number above 0.
    parsed.validate().map_err(|_| HeaderError::Invalid)?;
    Ok(parsed)
}

/// The command code of a request: the one in the header for `NonReplicated`, the one the
/// operation stands for otherwise (`None` for `Register`, `Logout` and internal operations).
pub(crate) fn command_code(header: &RequestHeader) -> Option<u32> {
    if header.operation == Operation::NonReplicated {
        let mut code = [0u8; 4];
        code.copy_from_slice(&header.reserved[CODE_RANGE]);
        return Some(u32::from_le_bytes(code));
    }
    header.operation.to_command_code()
}

/// Whether a request's body matches the checksum stamped in its header. The SDK stamps
/// replicated metadata requests and logins (XXH3-64 of the body); partition operations, reads
/// and requests of SDKs that predate the stamp carry 0, which is not checked.
pub(crate) fn body_matches(header: &RequestHeader, body: &[u8]) -> bool {
    header.request_checksum == 0
        || header.request_checksum == u128::from(twox_hash::XxHash3_64::oneshot(body))
}

/// Whether the answer to this request starts with a result section.
pub(crate) fn result_framed(header: &RequestHeader) -> bool {
    header.operation.is_result_framed()
}

/// The reply header for `request`, announcing a body of `body_len` bytes.
pub(crate) fn reply(request: &RequestHeader, status: u32, body_len: usize) -> [u8; HEADER] {
    let header = ReplyHeader {
        command: Command::Reply,
        size: u32::try_from(HEADER + body_len).unwrap_or(u32::MAX),
        request_checksum: request.request_checksum,
        client: request.client,
        request: request.request,
        operation: request.operation,
        status,
        ..ReplyHeader::default()
    };
    to_array(bytemuck::bytes_of(&header))
}

/// An eviction of the session of `client` (the SDK's id of itself).
pub(crate) fn eviction(client: u128, reason: EvictionReason) -> [u8; HEADER] {
    // The header must name a client (the SDK routes the frame by it); a request that named none
    // is answered for client 1.
    let client = client.max(1);
    let header = if reason == EvictionReason::IncompatibleProtocol {
        EvictionHeader::incompatible_protocol(
            0,
            0,
            0,
            client,
            IGGY_PROTOCOL_VERSION,
            IGGY_PROTOCOL_VERSION_MIN,
        )
    } else {
        EvictionHeader::new(0, 0, 0, client, reason)
    };
    to_array(bytemuck::bytes_of(&header))
}

/// The result section of a command that succeeded (its answer follows).
pub(crate) fn result_ok(out: &mut Vec<u8>) {
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// The result section of a command rejected with `code` (and nothing after it).
pub(crate) fn result_rejected(out: &mut Vec<u8>, code: u32) {
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&code.to_le_bytes());
}

fn to_array(bytes: &[u8]) -> [u8; HEADER] {
    let mut array = [0u8; HEADER];
    array.copy_from_slice(bytes);
    array
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;
    use iggy09_binary_protocol::consensus::{result_code, result_section_len};

    fn request(operation: Operation, code: u32, body: &[u8]) -> [u8; HEADER] {
        let mut reserved = [0u8; 60];
        reserved[CODE_RANGE].copy_from_slice(&code.to_le_bytes());
        let header = RequestHeader {
            command: Command::Request,
            operation,
            size: u32::try_from(HEADER + body.len()).unwrap(),
            client: 7,
            request: 3,
            session: 1,
            reserved,
            ..RequestHeader::default()
        };
        to_array(bytemuck::bytes_of(&header))
    }

    #[test]
    fn a_non_replicated_request_carries_its_code_in_the_header() {
        let bytes = request(Operation::NonReplicated, 1, &[]);
        let header = request_header(&bytes).unwrap();
        check!(command_code(&header) == Some(1));
        check!(frame_size(&bytes) == Ok(HEADER));
    }

    #[test]
    fn a_replicated_request_is_named_by_its_operation() {
        let bytes = request(Operation::CreateStream, 0, b"xy");
        let header = request_header(&bytes).unwrap();
        check!(command_code(&header) == Some(202));
        check!(frame_size(&bytes) == Ok(HEADER + 2));
        check!(result_framed(&header));
    }

    #[test]
    fn a_header_that_is_not_a_request_is_invalid() {
        let mut bytes = request(Operation::NonReplicated, 1, &[]);
        let command_at = std::mem::offset_of!(RequestHeader, command);
        bytes[command_at] = Command::Reply as u8;
        check!(request_header(&bytes).unwrap_err() == HeaderError::Invalid);
        bytes[command_at] = 250;
        check!(request_header(&bytes).unwrap_err() == HeaderError::Invalid);
    }

    #[test]
    fn a_replicated_request_without_a_session_is_invalid_but_a_read_is_not() {
        let session_at = std::mem::offset_of!(RequestHeader, session);
        let mut bytes = request(Operation::CreateStream, 0, &[]);
        bytes[session_at..session_at + 8].copy_from_slice(&0u64.to_le_bytes());
        check!(request_header(&bytes).unwrap_err() == HeaderError::Invalid);
        let mut bytes = request(Operation::NonReplicated, 1, &[]);
        bytes[session_at..session_at + 8].copy_from_slice(&0u64.to_le_bytes());
        check!(request_header(&bytes).is_ok());
    }

    #[test]
    fn sizes_below_the_header_or_above_the_limit_end_the_stream() {
        let mut bytes = request(Operation::NonReplicated, 1, &[]);
        bytes[48..52].copy_from_slice(&10u32.to_le_bytes());
        check!(frame_size(&bytes) == Err(HeaderError::BadSize));
        let too_big = u32::try_from(HEADER + MAX_BODY + 1).unwrap();
        bytes[48..52].copy_from_slice(&too_big.to_le_bytes());
        check!(frame_size(&bytes) == Err(HeaderError::BadSize));
    }

    #[test]
    fn the_body_checksum_is_checked_only_when_stamped() {
        let bytes = request(Operation::CreateStream, 0, b"abc");
        let mut header = request_header(&bytes).unwrap();
        check!(body_matches(&header, b"anything"));
        header.request_checksum = u128::from(twox_hash::XxHash3_64::oneshot(b"abc"));
        check!(body_matches(&header, b"abc"));
        check!(!body_matches(&header, b"abd"));
    }

    #[test]
    fn a_reply_echoes_the_request_and_states_its_size() {
        let header = request_header(&request(Operation::NonReplicated, 1, &[])).unwrap();
        let bytes = reply(&header, 40, 12);
        let parsed: ReplyHeader = try_pod_read_unaligned(&bytes).unwrap();
        check!(parsed.command == Command::Reply);
        check!(parsed.size as usize == HEADER + 12);
        check!(parsed.status == 40);
        check!(parsed.client == 7);
        check!(parsed.request == 3);
        check!(parsed.operation == Operation::NonReplicated);
    }

    #[test]
    fn result_sections_read_back_as_the_sdk_reads_them() {
        let mut ok = Vec::new();
        result_ok(&mut ok);
        ok.extend_from_slice(b"payload");
        check!(result_code(&ok) == Some(0));
        check!(&ok[result_section_len(&ok).unwrap()..] == b"payload");
        let mut rejected = Vec::new();
        result_rejected(&mut rejected, 1012);
        check!(result_code(&rejected) == Some(1012));
    }

    #[test]
    fn an_incompatible_protocol_eviction_carries_the_accepted_window() {
        let bytes = eviction(9, EvictionReason::IncompatibleProtocol);
        let parsed: EvictionHeader = try_pod_read_unaligned(&bytes).unwrap();
        check!(parsed.command == Command::Eviction);
        check!(parsed.reason == EvictionReason::IncompatibleProtocol);
        check!(parsed.server_protocol_version == IGGY_PROTOCOL_VERSION);
        check!(parsed.server_protocol_version_min == IGGY_PROTOCOL_VERSION_MIN);
        check!(parsed.client == 9);
    }
}

//! A raw 0.9 client connection for the 0.9 conformance suites: requests the SDK never sends, or
//! sends to a replica the SDK would not stay on.

use bytes::Bytes;
use iggy09_binary_protocol::consensus::{
    result_code, result_section_len, Command, EvictionHeader, Operation, ReplyHeader,
    RequestHeader, HEADER_SIZE,
};
use iggy09_binary_protocol::requests::users::LoginRegisterRequest;
use iggy09_binary_protocol::responses::users::LoginRegisterResponse;
use iggy09_binary_protocol::{ClientVersionInfo, WireDecode, WireEncode, WireName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw 0.9 connection, for what the SDK never sends.
pub(crate) struct Raw {
    pub(crate) stream: TcpStream,
    /// This client's id, random like the SDK's (a server tracks requests per client id).
    pub(crate) client: u128,
    /// The session the last register bound (0 before).
    pub(crate) session: u64,
    /// The last request number of a replicated operation.
    pub(crate) request: u64,
}

/// How long a raw exchange may take: a server that drops a frame says nothing, and the test
/// must fail rather than hang.
pub(crate) const RAW_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What came back for a raw request.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A reply: its header status and its body.
    Reply { status: u32, body: Vec<u8> },
    /// An eviction, with its header.
    #[allow(
        dead_code,
        reason = "read by the single-server suite, printed only by the cluster suite"
    )]
    Eviction(Box<EvictionHeader>),
}

impl Raw {
    pub(crate) async fn connect(address: &str) -> Self {
        Raw {
            stream: TcpStream::connect(address).await.expect("connect"),
            client: rand::random::<u128>().max(1),
            session: 0,
            request: 0,
        }
    }

    /// The header of a request: a register carries session and request 0, a replicated
    /// operation the bound session (1 when none is bound) and a new request number, a read the
    /// session if any.
    pub(crate) fn header(
        &mut self,
        operation: Operation,
        code: u32,
        body: &[u8],
        checksum: u128,
    ) -> RequestHeader {
        let mut reserved = [0u8; 60];
        if operation == Operation::NonReplicated {
            reserved[..4].copy_from_slice(&code.to_le_bytes());
        }
        let (session, request) = match operation {
            Operation::Register => (0, 0),
            Operation::NonReplicated => (self.session, self.request),
            _ => {
                self.request += 1;
                (self.session.max(1), self.request)
            }
        };
        RequestHeader {
            command: Command::Request,
            operation,
            size: u32::try_from(HEADER_SIZE + body.len()).unwrap(),
            client: self.client,
            request,
            session,
            request_checksum: checksum,
            reserved,
            ..RequestHeader::default()
        }
    }

    pub(crate) async fn send(
        &mut self,
        operation: Operation,
        code: u32,
        body: &[u8],
        checksum: bool,
    ) -> Frame {
        let stamp = if checksum {
            u128::from(twox_hash::XxHash3_64::oneshot(body))
        } else {
            0
        };
        let header = self.header(operation, code, body, stamp);
        self.send_with(&header, body).await
    }

    pub(crate) async fn send_with(&mut self, header: &RequestHeader, body: &[u8]) -> Frame {
        self.stream
            .write_all(bytemuck::bytes_of(header))
            .await
            .expect("write header");
        self.stream.write_all(body).await.expect("write body");
        let mut answer = [0u8; HEADER_SIZE];
        tokio::time::timeout(RAW_WAIT, self.stream.read_exact(&mut answer))
            .await
            .expect("the server answers in time")
            .expect("read answer header");
        if answer[std::mem::offset_of!(ReplyHeader, command)] == Command::Eviction as u8 {
            return Frame::Eviction(Box::new(bytemuck::checked::pod_read_unaligned(&answer)));
        }
        let reply: ReplyHeader = bytemuck::checked::pod_read_unaligned(&answer);
        let mut body = vec![0u8; reply.size as usize - HEADER_SIZE];
        tokio::time::timeout(RAW_WAIT, self.stream.read_exact(&mut body))
            .await
            .expect("the server answers in time")
            .expect("read body");
        Frame::Reply {
            status: reply.status,
            body,
        }
    }

    pub(crate) fn register_body(protocol_version: u32, user: &str, password: &str) -> Bytes {
        LoginRegisterRequest {
            version_info: ClientVersionInfo {
                protocol_version,
                sdk_name: WireName::new("conformance").unwrap(),
                sdk_version: WireName::new("0.0.1").unwrap(),
            },
            username: WireName::new(user).unwrap(),
            password: password.to_owned().into(),
            client_context: None,
        }
        .to_bytes()
    }

    /// A register with the given protocol version and credentials; binds its session.
    pub(crate) async fn register(
        &mut self,
        protocol_version: u32,
        user: &str,
        password: &str,
    ) -> Result<LoginRegisterResponse, Frame> {
        let body = Self::register_body(protocol_version, user, password);
        let deadline = tokio::time::Instant::now() + RAW_WAIT;
        loop {
            match self.send(Operation::Register, 0, &body, true).await {
                Frame::Reply { status: 0, body } if body.len() > 4 => {
                    // A register answer is result framed: 0 then the answer, or a rejection.
                    match result_code(&body) {
                        Some(0) => {
                            let at = result_section_len(&body).expect("result section");
                            let answer = LoginRegisterResponse::decode_from(&body[at..])
                                .expect("register answer");
                            self.session = answer.session;
                            return Ok(answer);
                        }
                        // Not committed yet (57, 58): a client replays the same register.
                        Some(57 | 58) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                        _ => return Err(Frame::Reply { status: 0, body }),
                    }
                }
                other => return Err(other),
            }
        }
    }
}

//! What the criterion benches drive (this crate's `wire`, the pipeline's `hot_path`): the 0.8
//! adapter's reading of a poll's answer and writing of a send's request. Not an API; hidden
//! from the docs.

use bytes::Bytes;
use iggy::prelude::{Identifier, Partitioning};
use iggy_common::wire_conversions::{identifier_to_wire, partitioning_to_wire};

use crate::{HeadersTail, Message, Polled};

/// `v08::wire::decode_polled`; `None` for an answer it refuses.
pub fn decode_polled_v08(answer: &Bytes) -> Option<Polled> {
    crate::v08::wire::decode_polled(answer).ok()
}

/// `v08::wire::encode_send`, ids and partitioning converted to the wire first (as a send
/// does); `None` for ids the wire cannot carry.
pub fn encode_send_v08(
    stream: &Identifier,
    topic: &Identifier,
    partitioning: &Partitioning,
    messages: &[Message],
    tail: Option<&dyn HeadersTail>,
) -> Option<Bytes> {
    Some(crate::v08::wire::encode_send(
        &identifier_to_wire(stream).ok()?,
        &identifier_to_wire(topic).ok()?,
        &partitioning_to_wire(partitioning).ok()?,
        messages,
        tail,
    ))
}

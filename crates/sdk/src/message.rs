//! Messages and offsets as the replicator handles them, whichever SDK generation polled or
//! sends them. Each adapter converts its SDK's records into these and back, moving the payload
//! and user headers (`Bytes`: shared, never copied).

use bytes::{Bytes, BytesMut};

/// One message: what a poll returns and what a send takes.
///
/// On a poll every field is the server's. On a send the server assigns `offset` and
/// `timestamp` itself; `id`, `origin_timestamp`, `payload` and `user_headers` land as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message id (0 lets the server pick one).
    pub id: u128,
    /// Its offset in the partition.
    pub offset: u64,
    /// When the server appended it (µs since the epoch).
    pub timestamp: u64,
    /// When its producer made it (µs since the epoch); copies keep the original's.
    pub origin_timestamp: u64,
    /// The payload.
    pub payload: Bytes,
    /// The user headers as encoded on the wire (both generations encode them alike), if any.
    pub user_headers: Option<Bytes>,
}

impl Message {
    /// The fixed header every message carries on the wire and on disk, in bytes.
    pub const HEADER_BYTES: u64 = 64;

    /// A message to send: `id`, made at `origin_timestamp`, carrying `payload` and no user
    /// headers.
    pub fn new(id: u128, origin_timestamp: u64, payload: Bytes) -> Self {
        Self {
            id,
            offset: 0,
            timestamp: 0,
            origin_timestamp,
            payload,
            user_headers: None,
        }
    }

    /// The same, carrying `user_headers` (already encoded).
    pub fn with_user_headers(mut self, user_headers: Option<Bytes>) -> Self {
        self.user_headers = user_headers;
        self
    }

    /// Its size on the wire: header, payload and user headers.
    pub fn wire_bytes(&self) -> u64 {
        Self::HEADER_BYTES + self.payload.len() as u64 + self.user_headers_len() as u64
    }

    /// The length of its encoded user headers.
    pub fn user_headers_len(&self) -> u32 {
        // A message's user headers are bounded far below 4 GiB by both generations.
        self.user_headers
            .as_ref()
            .map_or(0, |h| u32::try_from(h.len()).unwrap_or(u32::MAX))
    }
}

/// What a send appends to messages' user headers (the replicator's provenance), written by the
/// adapter straight into the request: a message's tail costs no buffer of its own, and the
/// batch itself stays as polled, so a retry sends the same bytes.
pub trait HeadersTail: Send + Sync {
    /// Appends `m`'s tail to `out` (nothing when `m` needs none, e.g. its headers already
    /// end with one).
    fn write_tail(&self, m: &Message, out: &mut BytesMut);

    /// The most a tail can add (to size a request's buffer).
    fn max_tail_len(&self) -> usize;
}

/// `messages` as a send with `tail` writes them: each one's tail appended to its own user
/// headers, in place (for an adapter that cannot write tails into its requests itself). The
/// tails share one buffer; a message that gets none keeps its headers untouched.
pub fn apply_tail(messages: &mut [Message], tail: &dyn HeadersTail) {
    let mut arena = BytesMut::with_capacity(messages.len() * tail.max_tail_len());
    for m in messages {
        let own = m.user_headers.as_deref().unwrap_or_default();
        arena.extend_from_slice(own);
        tail.write_tail(m, &mut arena);
        if arena.len() > own.len() {
            m.user_headers = Some(arena.split().freeze());
        } else {
            arena.clear();
        }
    }
}

/// An SDK's own message type: what a poll answers with, and what a [`Message`] lends its
/// payload and user headers to for one send.
pub(crate) trait SdkMessage: Sized {
    /// The SDK's message for `m`, holding `m`'s payload and user headers (taken out of `m`).
    fn borrow_from(m: &mut Message) -> Self;
    /// The payload and user headers, taken back out.
    fn give_back(&mut self) -> (Bytes, Option<Bytes>);
    /// A polled message as the replicator's own (payload and headers moved).
    fn into_message(self) -> Message;
}

/// Implements [`SdkMessage`] for the `IggyMessage` of the SDK whose crate is `$sdk` (SDK 0.10's
/// and 0.11's have the same fields under different types). The checksum is the server's to
/// compute, as for any producer's message.
macro_rules! impl_sdk_message {
    ($sdk:ident) => {
        impl $crate::message::SdkMessage for $sdk::IggyMessage {
            fn borrow_from(m: &mut $crate::Message) -> Self {
                let header = $sdk::IggyMessageHeader {
                    checksum: 0,
                    id: m.id,
                    offset: m.offset,
                    timestamp: m.timestamp,
                    origin_timestamp: m.origin_timestamp,
                    user_headers_length: m.user_headers_len(),
                    // A payload is bounded far below 4 GiB by both generations.
                    payload_length: u32::try_from(m.payload.len()).unwrap_or(u32::MAX),
                    reserved: 0,
                };
                $sdk::IggyMessage {
                    header,
                    payload: std::mem::take(&mut m.payload),
                    user_headers: m.user_headers.take(),
                }
            }

            fn give_back(&mut self) -> (bytes::Bytes, Option<bytes::Bytes>) {
                (std::mem::take(&mut self.payload), self.user_headers.take())
            }

            fn into_message(self) -> $crate::Message {
                let h = self.header;
                $crate::Message {
                    id: h.id,
                    offset: h.offset,
                    timestamp: h.timestamp,
                    origin_timestamp: h.origin_timestamp,
                    payload: self.payload,
                    user_headers: self.user_headers,
                }
            }
        }
    };
}

pub(crate) use impl_sdk_message;

/// `messages` lent to an SDK's message type `T` for one send: each payload and user headers
/// move into the SDK's messages and back when this ends, however the send ends (an error, or
/// the call dropped mid-way, which drops this too). A send so changes no reference count and
/// copies nothing, as when the SDK's own messages were sent; and a batch kept for a retry
/// after a failed or abandoned send is whole again.
pub(crate) struct Lent<'a, T: SdkMessage> {
    messages: &'a mut [Message],
    lent: Vec<T>,
}

impl<'a, T: SdkMessage> Lent<'a, T> {
    pub(crate) fn new(messages: &'a mut [Message]) -> Self {
        let lent = messages.iter_mut().map(T::borrow_from).collect();
        Self { messages, lent }
    }

    /// The SDK's messages to send.
    pub(crate) fn sdk(&mut self) -> &mut [T] {
        &mut self.lent
    }
}

impl<T: SdkMessage> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        for (m, lent) in self.messages.iter_mut().zip(&mut self.lent) {
            (m.payload, m.user_headers) = lent.give_back();
        }
    }
}

/// What one poll of a partition returned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Polled {
    /// The partition polled.
    pub partition: u32,
    /// The partition's current (highest) offset when the server answered; 0 for an empty
    /// partition.
    pub current_offset: u64,
    /// The messages, in offset order.
    pub messages: Vec<Message>,
}

/// A consumer's offset in one partition, as the server stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredOffset {
    /// The partition.
    pub partition: u32,
    /// The partition's current (highest) offset.
    pub current_offset: u64,
    /// The offset the consumer (or consumer group) stored.
    pub stored_offset: u64,
}

/// What the server confirmed of one request of a send: where its messages landed. Iggy 0.9
/// answers a send with one place per partition written; an answer without one (a request the
/// server recognised as a replay and answered from its cache) leaves `places` empty. Iggy 0.8
/// confirms nothing, so its sends return no `Confirmed` at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// How many messages the request carried.
    pub messages: u32,
    /// Where the server says they landed.
    pub places: Vec<Place>,
}

/// A partition and the offset a request's first message landed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The partition the server names.
    pub partition: u32,
    /// The offset of the request's first message in it.
    pub base_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn a_message_counts_its_header_payload_and_user_headers() {
        let m = Message::new(7, 1, Bytes::from_static(b"abc"));
        check!(m.wire_bytes() == 64 + 3);
        let m = m.with_user_headers(Some(Bytes::from_static(b"hh")));
        check!(m.user_headers_len() == 2);
        check!(m.wire_bytes() == 64 + 3 + 2);
    }
}

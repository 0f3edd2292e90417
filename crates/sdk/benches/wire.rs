//! Criterion micro-bench of one copy step's CPU on the 0.8 wire, without the network: a poll's
//! answer of 1000 messages (256-byte payloads, as the catch-up benchmark's) read, and the same
//! messages written into a send's request.
//!
//! - `copy_step/sdk`: SDK 0.10's own calls' work (`PolledMessages::from_bytes`, then
//!   `SendMessagesEncoder` over the polled messages): what the raw loop's process does.
//! - `copy_step/adapter`: the replicator's 0.8 adapter (`v08::wire`).
//!
//! Run: `cargo bench -p replicator-sdk --bench wire` (add `-- --warm-up-time 1
//! --measurement-time 3` for a quick look). It prints; it never fails on a number.

use std::hint::black_box;

use bytes::{BufMut as _, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use iggy::prelude::{Identifier, Partitioning, PolledMessages};
use iggy_binary_protocol::requests::messages::{RawMessage, SendMessagesEncoder};
use iggy_common::wire_conversions::{identifier_to_wire, partitioning_to_wire};
use replicator_sdk::bench_support::{decode_polled_v08, encode_send_v08};

/// The node's allocator: a batch's request is a few hundred KiB, and how the allocator serves
/// those is part of what the node pays (glibc's malloc made these figures swing fivefold).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Messages per poll (the reader's default poll size).
const BATCH: u64 = 1000;
/// Payload bytes per message.
const PAYLOAD: usize = 256;

/// A poll's answer as a 0.8 server writes it.
fn answer() -> Bytes {
    let mut out = BytesMut::new();
    out.put_u32_le(0);
    out.put_u64_le(BATCH - 1);
    out.put_u32_le(BATCH as u32);
    for offset in 0..BATCH {
        out.put_u64_le(0);
        out.put_u128_le(u128::from(offset) + 1);
        out.put_u64_le(offset);
        out.put_u64_le(1_700_000_000_000_000 + offset);
        out.put_u64_le(1_700_000_000_000_000 + offset);
        out.put_u32_le(0);
        out.put_u32_le(PAYLOAD as u32);
        out.put_u64_le(0);
        out.put_bytes(b'p', PAYLOAD);
    }
    out.freeze()
}

fn copy_step(c: &mut Criterion) {
    let answer = answer();
    let (stream_id, topic_id) = (
        Identifier::named("orders").expect("name"),
        Identifier::named("events").expect("name"),
    );
    let partitioning = Partitioning::partition_id(0);
    let stream = identifier_to_wire(&stream_id).expect("wire");
    let topic = identifier_to_wire(&topic_id).expect("wire");
    let to = partitioning_to_wire(&partitioning).expect("wire");
    let mut group = c.benchmark_group("copy_step");
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function("sdk", |b| {
        b.iter(|| {
            let polled = PolledMessages::from_bytes(black_box(answer.clone())).expect("valid");
            let raw: Vec<RawMessage<'_>> = polled
                .messages
                .iter()
                .map(|m| RawMessage {
                    id: m.header.id,
                    origin_timestamp: m.header.origin_timestamp,
                    headers: m.user_headers.as_deref(),
                    payload: &m.payload,
                })
                .collect();
            let size = SendMessagesEncoder::encoded_size(&stream, &topic, &to, &raw);
            let mut buf = BytesMut::with_capacity(size);
            SendMessagesEncoder::encode(&mut buf, &stream, &topic, &to, &raw);
            black_box(buf.freeze())
        });
    });
    group.bench_function("adapter", |b| {
        b.iter(|| {
            let polled = decode_polled_v08(black_box(&answer)).expect("valid");
            black_box(encode_send_v08(
                &stream_id,
                &topic_id,
                &partitioning,
                &polled.messages,
                None,
            ))
        });
    });
    group.finish();
}

criterion_group!(benches, copy_step);
criterion_main!(benches);

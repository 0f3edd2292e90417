//! Criterion micro-benches of the writer's per-message hot path: provenance stamping and lookup,
//! and the batch conversion (`prepare`) that turns a polled batch into the messages sent
//! downstream.
//!
//! - `stamp/{stamp_into,stamp}/{no_user_headers,3_user_headers,second_hop}`: the provenance of
//!   one message, written into a reused arena (what `prepare` does) or into a fresh buffer. A
//!   second hop is a message that already carries our provenance, so ours is rewritten.
//! - `find/{stamped_no_user_headers,stamped_3_user_headers,unstamped_3_user_headers}`: reading
//!   provenance back (loop prevention on every message with headers, the downstream tail scan).
//! - `prepare/{provenance_off,provenance_on,provenance_on_3_user_headers,…}`: a batch of 1000
//!   messages with 256-byte payloads converted, and the 0.8 send request written from it (the
//!   provenance is written there, as the 0.8 adapter's send does); throughput in messages, so
//!   criterion reports msgs/s. The conversion works in place, so each iteration converts a
//!   fresh polled batch built outside the measurement (and dropped outside it too: the writer
//!   drops it after sending).
//!
//! Run: `cargo bench -p replicator-pipeline --bench hot_path` (for a quick look add
//! `-- --warm-up-time 1 --measurement-time 3`, or a filter such as `-- prepare`). It prints; it
//! never fails on a number.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::str::FromStr;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use iggy::prelude::{HeaderKey, HeaderValue, IggyMessage};
use replicator_pipeline::bench_support::{prepare, Batch, PrepareParams};
use replicator_pipeline::provenance::{self, Format, Stamp};
use replicator_sdk::Message;

/// The node's allocator: a batch's request is a few hundred KiB, and how the allocator serves
/// those is part of what the node pays (glibc's malloc made these figures swing fivefold).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Messages per batch (the reader's default poll size).
const BATCH: u64 = 1000;
/// Payload bytes per message.
const PAYLOAD: usize = 256;
/// The flow's source alias.
const SOURCE: &str = "us";
/// The flow's target alias.
const TARGET: &str = "eu";
/// Creation time (µs) of the upstream topic.
const CREATED: u64 = 1_700_000_000_000_000;

/// Encoded user headers, as the Iggy SDK encodes them.
fn user_headers(pairs: &[(&str, &str)]) -> Bytes {
    let map: BTreeMap<HeaderKey, HeaderValue> = pairs
        .iter()
        .map(|(k, v)| {
            (
                HeaderKey::from_str(k).expect("valid header key"),
                HeaderValue::from_str(v).expect("valid header value"),
            )
        })
        .collect();
    IggyMessage::builder()
        .payload(Bytes::from_static(b"x"))
        .user_headers(map)
        .build()
        .expect("valid message")
        .user_headers
        .expect("user headers set")
}

/// Three string headers a producer typically sets.
fn three_headers() -> Bytes {
    user_headers(&[
        ("trace-id", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("content-type", "application/json"),
        ("tenant", "acme-eu-west"),
    ])
}

/// The three user headers plus provenance from a first hop `ap` → `us`: what the `us` → `eu`
/// writer sees on a second hop.
fn second_hop_headers() -> Bytes {
    let first = Stamp {
        source: "ap",
        offset: 41_999,
        history_label: CREATED - 1,
        format: Format::Entries,
    };
    provenance::stamp(Some(&three_headers()), &first).expect("fits the header limit")
}

/// What the `us` → `eu` writer stamps on upstream offset `offset`.
fn our_stamp(offset: u64) -> Stamp<'static> {
    Stamp {
        source: SOURCE,
        offset,
        history_label: CREATED,
        format: Format::Entries,
    }
}

fn stamping(c: &mut Criterion) {
    let cases = [
        ("no_user_headers", None),
        ("3_user_headers", Some(three_headers())),
        ("second_hop", Some(second_hop_headers())),
    ];
    let mut group = c.benchmark_group("stamp");
    let stamp = our_stamp(1_234_567);
    for (name, headers) in &cases {
        let headers = headers.as_deref();
        // Sized like `prepare`'s arena for a whole batch; each result is split off and dropped.
        let mut arena = BytesMut::with_capacity(BATCH as usize * (128 + SOURCE.len()));
        group.bench_function(format!("stamp_into/{name}"), |b| {
            b.iter(|| provenance::stamp_into(&mut arena, black_box(headers), black_box(&stamp)));
        });
        group.bench_function(format!("stamp/{name}"), |b| {
            b.iter(|| provenance::stamp(black_box(headers), black_box(&stamp)));
        });
    }
    group.finish();
}

fn finding(c: &mut Criterion) {
    let stamp = our_stamp(1_234_567);
    let cases = [
        (
            "stamped_no_user_headers",
            provenance::stamp(None, &stamp).expect("fits the header limit"),
        ),
        (
            "stamped_3_user_headers",
            provenance::stamp(Some(&three_headers()), &stamp).expect("fits the header limit"),
        ),
        ("unstamped_3_user_headers", three_headers()),
    ];
    let mut group = c.benchmark_group("find");
    for (name, headers) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| provenance::find(black_box(Some(headers.as_ref()))));
        });
    }
    group.finish();
}

/// A polled batch of 1000 messages at offsets `0..1000` with 256-byte payloads.
fn batch(headers: Option<&Bytes>) -> Batch {
    let messages = (0..BATCH)
        .map(|offset| {
            let payload = Bytes::from(vec![(offset % 251) as u8; PAYLOAD]);
            let mut m = Message::new(u128::from(offset) + 1, CREATED + offset, payload)
                .with_user_headers(headers.cloned());
            m.offset = offset;
            m.timestamp = CREATED + 1_000 + offset;
            m
        })
        .collect();
    Batch::new(messages).expect("1000 messages")
}

fn preparing(c: &mut Criterion) {
    let headers = three_headers();
    let cases = [
        ("provenance_off", None, false, Format::Entries),
        ("provenance_on", None, true, Format::Entries),
        (
            "provenance_on_3_user_headers",
            Some(&headers),
            true,
            Format::Entries,
        ),
        ("compact_provenance", None, true, Format::Compact),
        (
            "compact_provenance_3_user_headers",
            Some(&headers),
            true,
            Format::Compact,
        ),
    ];
    let mut group = c.benchmark_group("prepare");
    group.throughput(Throughput::Elements(BATCH));
    for (name, headers, provenance, format) in cases {
        let params = PrepareParams {
            last_written: None,
            source: SOURCE,
            target: TARGET,
            provenance,
            format,
            history_label: CREATED,
        };
        let mut once = batch(headers);
        prepare(&mut once, &params).expect("fits the header limit");
        assert!(
            once.messages().len() == BATCH as usize,
            "no message is dropped"
        );
        // The conversion works in place: every iteration gets a fresh polled batch, built (and
        // dropped) outside the measurement.
        group.bench_function(name, |b| {
            b.iter_batched(
                || batch(headers),
                |mut polled| {
                    let request = prepare(&mut polled, black_box(&params)).expect("fits");
                    (polled, request)
                },
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, stamping, finding, preparing);
criterion_main!(benches);

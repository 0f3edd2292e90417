//! Provenance headers: which cluster and offset a downstream message was copied from.
//!
//! Iggy user headers are a flat list of TLV entries (`key kind u8, key len u32 LE, key, value kind
//! u8, value len u32 LE, value`). Writers copy the user's entries byte for byte and append their
//! own, in one of two formats ([`Format`]): three or four string-keyed entries (format 1, 82
//! bytes a message), or one compact binary entry (format 2, about 30), written once every
//! member of the cluster reads it (feature level 4). Every reader of provenance reads both
//! through [`find`] and [`strip`], without building a map; a partition may hold format-1
//! copies followed by format-2 ones.

use bytes::{BufMut, Bytes, BytesMut};

/// Key of the source cluster alias (String), e.g. `us`.
pub const SOURCE_KEY: &str = "repl-source";
/// Key of the upstream offset of the message (Uint64).
pub const OFFSET_KEY: &str = "repl-offset";
/// Key of the cluster where the message was first produced (String); kept across hops. Written
/// only when it differs from the source (from the second hop on): without it the source is the
/// origin, and a first-hop message carries 23 bytes less.
pub const ORIGIN_KEY: &str = "repl-origin";
/// Key of the upstream partition's history the message was copied from (Uint64): the creation
/// time (µs) of the upstream topic, plus its count of resets in the high bits once the
/// partition was reset (purged) under the replicator; see [`History`].
pub const CREATED_KEY: &str = "repl-created";

/// Low bits of a history label that hold the topic's creation time (µs since the Unix
/// epoch; 2^52 µs reach the year 2112).
const CREATED_BITS: u32 = 52;
/// Mask of the creation time in a label.
const CREATED_MASK: u64 = (1 << CREATED_BITS) - 1;

/// One history of an upstream partition, as `repl-created` labels it and offsets are confirmed
/// under (`history_label` of commits and progress): the creation time of the upstream topic
/// and how many times the replicator saw the partition reset (purged: offsets restart at 0)
/// since then.
///
/// A deleted and recreated topic gets a new creation time; a purge does not, so the
/// replicator counts it in `resets`. The label of a history without resets is the creation
/// time itself, so labels written before resets were counted read back unchanged; a reset
/// partition is labelled `created_at | resets << 52`. Offsets are comparable only within one
/// history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct History {
    /// Creation time (µs) of the upstream topic (its low 52 bits).
    pub created_at: u64,
    /// Resets of the partition seen since the topic was created.
    pub resets: u16,
}

impl History {
    /// The most resets one topic's partition can be labelled with (12 bits).
    pub const MAX_RESETS: u16 = (1 << (64 - CREATED_BITS)) - 1;

    /// The first history of a topic created at `created_at` (µs).
    pub fn first(created_at: u64) -> Self {
        Self {
            created_at: created_at & CREATED_MASK,
            resets: 0,
        }
    }

    /// The history a label (`repl-created`, a commit's `history_label`) names.
    pub fn from_label(label: u64) -> Self {
        Self {
            created_at: label & CREATED_MASK,
            resets: (label >> CREATED_BITS) as u16,
        }
    }

    /// The label stamped in `repl-created` and committed as `history_label`.
    pub fn label(self) -> u64 {
        (self.created_at & CREATED_MASK) | u64::from(self.resets) << CREATED_BITS
    }

    /// Whether this is a history of the topic created at `created_at` (µs).
    pub fn is_of(self, created_at: u64) -> bool {
        self.created_at == created_at & CREATED_MASK
    }

    /// The history after a reset; `None` past [`History::MAX_RESETS`].
    pub fn next(self) -> Option<Self> {
        (self.resets < Self::MAX_RESETS).then_some(Self {
            created_at: self.created_at,
            resets: self.resets + 1,
        })
    }
}

/// Iggy's header kind code for raw bytes.
const KIND_RAW: u8 = 1;
/// Iggy's header kind code for UTF-8 strings.
const KIND_STRING: u8 = 2;
/// Iggy's header kind code for `u64`.
const KIND_UINT64: u8 = 12;
/// Iggy's limit on the encoded user headers of one message.
pub const MAX_USER_HEADERS_SIZE: usize = 100_000;

/// Key of the compact provenance entry (format 2): one entry whose raw value holds the source,
/// the offset, the history and, from the second hop on, the origin (see [`Format::Compact`]).
pub const COMPACT_KEY: &str = "repl";
/// The first byte of a compact value: its format in the high nibble (2), flags in the low one.
const COMPACT_FORMAT: u8 = 0x20;
/// Flag of a compact value that carries an origin.
const COMPACT_HAS_ORIGIN: u8 = 0x01;

/// The provenance a writer stamps. Every reader reads both, in one place ([`find`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Format 1 (v0.1.0 on): three or four string-keyed entries, `repl-source` (the alias),
    /// `repl-offset` and `repl-created` (u64 little-endian), `repl-origin` (the alias) from the
    /// second hop on: 82 bytes for a two-letter alias, 105 with an origin.
    Entries,
    /// Format 2 (feature level 4 on): one entry `repl`, kind raw, whose value is a first byte
    /// `0x20` (`0x21` with an origin), the source's [`cluster_id`] (u32 little-endian), the
    /// offset and the history label as LEB128 varints, then the origin's id (u32 little-endian)
    /// when flagged: 29 to 32 bytes for offsets below 2^35, whatever the alias, 4 more with an
    /// origin.
    Compact,
}

/// The id compact provenance names a cluster by: the 32-bit FNV-1a hash of its alias. A
/// pipeline refuses to start with two aliases of the same id ([`distinct_cluster_ids`]).
pub fn cluster_id(alias: &str) -> u32 {
    alias.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// `Err((a, b))` when two of `aliases` share a [`cluster_id`] (compact provenance could not
/// tell them apart).
pub fn distinct_cluster_ids<'a>(
    aliases: impl IntoIterator<Item = &'a str>,
) -> Result<(), (String, String)> {
    let mut seen = std::collections::BTreeMap::new();
    for alias in aliases {
        if let Some(other) = seen.insert(cluster_id(alias), alias) {
            if other != alias {
                return Err((other.to_owned(), alias.to_owned()));
            }
        }
    }
    Ok(())
}

/// A cluster as provenance names it: format 1 by alias, format 2 by [`cluster_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterRef<'a> {
    /// By alias (format 1).
    Alias(&'a str),
    /// By id (format 2; also a format-1 origin written as `#<id in hex>`, see [`stamp_into`]).
    Id(u32),
}

impl ClusterRef<'_> {
    /// Whether this names the cluster `alias`.
    pub fn is(&self, alias: &str) -> bool {
        match self {
            ClusterRef::Alias(a) => *a == alias,
            ClusterRef::Id(id) => *id == cluster_id(alias),
        }
    }

    fn id(&self) -> u32 {
        match self {
            ClusterRef::Alias(a) => cluster_id(a),
            ClusterRef::Id(id) => *id,
        }
    }

    /// A format-1 alias entry's value: `#<id>` stands for an id (an origin known only by id).
    fn of_alias(alias: &str) -> ClusterRef<'_> {
        match alias
            .strip_prefix('#')
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        {
            Some(id) if alias.len() == 9 => ClusterRef::Id(id),
            _ => ClusterRef::Alias(alias),
        }
    }
}

impl std::fmt::Display for ClusterRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterRef::Alias(a) => f.write_str(a),
            ClusterRef::Id(id) => write!(f, "#{id:08x}"),
        }
    }
}

/// One TLV entry as borrowed slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry<'a> {
    /// Key kind code.
    key_kind: u8,
    /// Key bytes.
    key: &'a [u8],
    /// Value kind code.
    value_kind: u8,
    /// Value bytes.
    value: &'a [u8],
    /// The whole encoded entry.
    raw: &'a [u8],
}

/// Iterates the entries of encoded user headers; `None` on the first malformed entry.
fn entries(mut bytes: &[u8]) -> impl Iterator<Item = Option<Entry<'_>>> {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let parsed = (|| {
            let all = bytes;
            let (key_kind, key, rest) = field(bytes)?;
            let (value_kind, value, rest) = field(rest)?;
            let used = all.len() - rest.len();
            Some((
                Entry {
                    key_kind,
                    key,
                    value_kind,
                    value,
                    raw: &all[..used],
                },
                rest,
            ))
        })();
        match parsed {
            Some((entry, rest)) => {
                bytes = rest;
                Some(Some(entry))
            }
            None => {
                bytes = &[];
                Some(None)
            }
        }
    })
}

/// Splits one `kind, len, bytes` field off the front.
fn field(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&kind, rest) = bytes.split_first()?;
    let len_bytes: [u8; 4] = rest.get(..4)?.try_into().ok()?;
    let len = u32::from_le_bytes(len_bytes) as usize;
    let value = rest.get(4..4 + len)?;
    Some((kind, value, &rest[4 + len..]))
}

/// A compact value, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Compact {
    source: u32,
    offset: u64,
    history_label: u64,
    origin: Option<u32>,
}

impl Compact {
    /// Decodes a compact value; `None` unless it is one, whole and exact.
    fn decode(value: &[u8]) -> Option<Self> {
        let (&first, rest) = value.split_first()?;
        if first & 0xf0 != COMPACT_FORMAT || first & 0x0f & !COMPACT_HAS_ORIGIN != 0 {
            return None;
        }
        let (source, rest) = u32_le(rest)?;
        let (offset, rest) = varint(rest)?;
        let (history_label, rest) = varint(rest)?;
        let (origin, rest) = if first & COMPACT_HAS_ORIGIN != 0 {
            let (origin, rest) = u32_le(rest)?;
            (Some(origin), rest)
        } else {
            (None, rest)
        };
        rest.is_empty().then_some(Self {
            source,
            offset,
            history_label,
            origin,
        })
    }

    /// The value's length.
    fn len(&self) -> usize {
        1 + 4
            + varint_len(self.offset)
            + varint_len(self.history_label)
            + 4 * usize::from(self.origin.is_some())
    }

    /// Appends the whole entry (key and value).
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u8(KIND_STRING);
        buf.put_u32_le(COMPACT_KEY.len() as u32);
        buf.put_slice(COMPACT_KEY.as_bytes());
        buf.put_u8(KIND_RAW);
        buf.put_u32_le(self.len() as u32);
        buf.put_u8(
            COMPACT_FORMAT
                | if self.origin.is_some() {
                    COMPACT_HAS_ORIGIN
                } else {
                    0
                },
        );
        buf.put_u32_le(self.source);
        put_varint(buf, self.offset);
        put_varint(buf, self.history_label);
        if let Some(origin) = self.origin {
            buf.put_u32_le(origin);
        }
    }
}

fn u32_le(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

/// A LEB128 varint: 7 bits per byte, low first, the high bit set on all but the last.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f).checked_shl(7 * i as u32)?;
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

fn varint_len(value: u64) -> usize {
    (64 - value.max(1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(buf: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8(value as u8 | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

/// Whether an entry is one of ours: a format-1 key, or a well-formed compact entry (a user's
/// own `repl` header that is not one stays the user's).
fn is_ours(entry: &Entry<'_>) -> bool {
    entry.key_kind == KIND_STRING
        && ([SOURCE_KEY, OFFSET_KEY, ORIGIN_KEY, CREATED_KEY]
            .iter()
            .any(|k| k.as_bytes() == entry.key)
            || (entry.key == COMPACT_KEY.as_bytes()
                && entry.value_kind == KIND_RAW
                && Compact::decode(entry.value).is_some()))
}

/// The provenance found on a message (each part only if present and well-formed), in either
/// format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found<'a> {
    /// The cluster the message was last copied from.
    pub source: Option<ClusterRef<'a>>,
    /// Offset of the message in that cluster.
    pub offset: Option<u64>,
    /// Cluster where the message was first produced, when not the source.
    pub origin: Option<ClusterRef<'a>>,
    /// Label of the upstream history the copy belongs to (`repl-created`,
    /// [`History::label`]).
    pub history_label: Option<u64>,
    /// The format it was found in (`None`: none found).
    pub format: Option<Format>,
}

impl<'a> Found<'a> {
    /// The cluster the message was first produced in, if it was ever replicated.
    pub fn origin_cluster(&self) -> Option<ClusterRef<'a>> {
        self.origin.or(self.source)
    }

    /// Whether the message was last copied from the cluster `alias`.
    pub fn from_source(&self, alias: &str) -> bool {
        self.source.is_some_and(|s| s.is(alias))
    }

    /// Whether the message was first produced in the cluster `alias` (and copied since).
    pub fn originated_in(&self, alias: &str) -> bool {
        self.origin_cluster().is_some_and(|o| o.is(alias))
    }
}

/// Reads our entries from encoded user headers, in either format (malformed headers yield what
/// was read so far).
pub fn find(user_headers: Option<&[u8]>) -> Found<'_> {
    let mut found = Found::default();
    let Some(bytes) = user_headers else {
        return found;
    };
    for entry in entries(bytes) {
        let Some(entry) = entry else { break };
        if entry.key_kind != KIND_STRING {
            continue;
        }
        let as_str = || {
            (entry.value_kind == KIND_STRING)
                .then(|| std::str::from_utf8(entry.value).ok())
                .flatten()
        };
        let as_u64 = || {
            (entry.value_kind == KIND_UINT64)
                .then(|| entry.value.try_into().ok().map(u64::from_le_bytes))
                .flatten()
        };
        match entry.key {
            k if k == SOURCE_KEY.as_bytes() => {
                found.source = as_str().map(ClusterRef::of_alias);
                found.format = Some(Format::Entries);
            }
            k if k == OFFSET_KEY.as_bytes() => found.offset = as_u64(),
            k if k == ORIGIN_KEY.as_bytes() => found.origin = as_str().map(ClusterRef::of_alias),
            k if k == CREATED_KEY.as_bytes() => found.history_label = as_u64(),
            k if k == COMPACT_KEY.as_bytes() && entry.value_kind == KIND_RAW => {
                if let Some(c) = Compact::decode(entry.value) {
                    found.source = Some(ClusterRef::Id(c.source));
                    found.offset = Some(c.offset);
                    found.history_label = Some(c.history_label);
                    found.origin = c.origin.map(ClusterRef::Id);
                    found.format = Some(Format::Compact);
                }
            }
            _ => {}
        }
    }
    found
}

/// Whether `copy` (a downstream message) is a copy of `original` (an upstream one): the same
/// id, origin timestamp, payload and user headers apart from provenance.
pub fn same_copy(original: &replicator_sdk::Message, copy: &replicator_sdk::Message) -> bool {
    original.id == copy.id
        && original.origin_timestamp == copy.origin_timestamp
        && original.payload == copy.payload
        && strip(original.user_headers.as_deref()) == strip(copy.user_headers.as_deref())
}

/// Whether the headers hold any entry of ours (cheap pre-check before rewriting).
pub(crate) fn has_ours(bytes: &[u8]) -> bool {
    entries(bytes).any(|e| e.is_some_and(|e| is_ours(&e)))
}

/// The user's own entries: the headers without ours, byte for byte (`None` if nothing is left).
/// Malformed headers are returned unchanged.
pub fn strip(user_headers: Option<&[u8]>) -> Option<Vec<u8>> {
    let bytes = user_headers?;
    if entries(bytes).any(|e| e.is_none()) {
        return Some(bytes.to_vec());
    }
    let kept: Vec<u8> = entries(bytes)
        .flatten()
        .filter(|e| !is_ours(e))
        .flat_map(|e| e.raw.iter().copied())
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// What a writer stamps on each message.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// Alias of the cluster the message is copied from (the flow's source).
    pub source: &'a str,
    /// Upstream offset of the message.
    pub offset: u64,
    /// Label of the upstream history copied ([`History::label`]).
    pub history_label: u64,
    /// The format to write.
    pub format: Format,
}

/// Encoded size of one entry with a string key.
fn entry_len(key: &str, value_len: usize) -> usize {
    1 + 4 + key.len() + 1 + 4 + value_len
}

/// Appends one entry with a string key.
fn put_entry(buf: &mut BytesMut, key: &str, kind: u8, value: &[u8]) {
    buf.put_u8(KIND_STRING);
    buf.put_u32_le(key.len() as u32);
    buf.put_slice(key.as_bytes());
    buf.put_u8(kind);
    buf.put_u32_le(value.len() as u32);
    buf.put_slice(value);
}

/// The user headers to send downstream: the user's entries byte for byte, then ours. An origin
/// found on the message is kept (it names the first hop); otherwise the source is the origin
/// and no origin is written. Provenance the message carries is replaced, in either format.
/// `None` when the result would exceed Iggy's user-header limit.
pub fn stamp(user_headers: Option<&[u8]>, stamp: &Stamp<'_>) -> Option<Bytes> {
    stamp_into(&mut BytesMut::new(), user_headers, stamp)
}

/// [`stamp`], writing into `arena` and splitting the result off it, so that one allocation can
/// serve a whole batch. Format 1 names an origin known only by id (found in format 2) as
/// `#<id in hex>`, which readers of this release read back as the id.
pub fn stamp_into(
    arena: &mut BytesMut,
    user_headers: Option<&[u8]>,
    stamp: &Stamp<'_>,
) -> Option<Bytes> {
    let existing = user_headers.unwrap_or_default();
    let (origin, rewrite) = if existing.is_empty() {
        (None, false)
    } else {
        let found = find(user_headers);
        (
            found.origin_cluster().filter(|o| !o.is(stamp.source)),
            has_ours(existing),
        )
    };
    // Format 1 names the origin by text; format 2 by id (no text to build per message).
    let origin_text = origin
        .filter(|_| stamp.format == Format::Entries)
        .map(|o| o.to_string());
    let compact = Compact {
        source: cluster_id(stamp.source),
        offset: stamp.offset,
        history_label: stamp.history_label,
        origin: origin.map(|o| o.id()),
    };
    let ours = match stamp.format {
        Format::Entries => {
            entry_len(SOURCE_KEY, stamp.source.len())
                + entry_len(OFFSET_KEY, 8)
                + origin_text
                    .as_ref()
                    .map_or(0, |o| entry_len(ORIGIN_KEY, o.len()))
                + entry_len(CREATED_KEY, 8)
        }
        Format::Compact => entry_len(COMPACT_KEY, compact.len()),
    };
    if existing.len() + ours > MAX_USER_HEADERS_SIZE {
        return None;
    }
    arena.clear();
    arena.reserve(existing.len() + ours);
    if rewrite {
        for entry in entries(existing).flatten().filter(|e| !is_ours(e)) {
            arena.put_slice(entry.raw);
        }
    } else {
        arena.put_slice(existing);
    }
    match stamp.format {
        Format::Entries => {
            put_entry(arena, SOURCE_KEY, KIND_STRING, stamp.source.as_bytes());
            put_entry(arena, OFFSET_KEY, KIND_UINT64, &stamp.offset.to_le_bytes());
            if let Some(origin) = &origin_text {
                put_entry(arena, ORIGIN_KEY, KIND_STRING, origin.as_bytes());
            }
            put_entry(
                arena,
                CREATED_KEY,
                KIND_UINT64,
                &stamp.history_label.to_le_bytes(),
            );
        }
        Format::Compact => compact.put(arena),
    }
    Some(arena.split().freeze())
}

/// Stamps the messages of one batch. For messages that carry no provenance yet (origin =
/// source), everything but the offset is the same for the whole batch: format 1's entries are
/// encoded once and only the offset is written per message; format 2's entry is encoded once
/// but for its length and offset varint. Messages that already
/// carry provenance (a second hop) take the general path of [`stamp_into`].
#[derive(Debug, Clone)]
pub struct Stamper<'a> {
    /// Alias of the cluster the messages are copied from.
    source: &'a str,
    /// Label of the upstream history copied ([`History::label`]).
    history_label: u64,
    /// The format written.
    format: Format,
    /// Format 1: our entries for origin = source (no origin entry) and offset 0. Format 2: the
    /// entry up to its value's offset varint (the value's length left 0).
    block: Vec<u8>,
    /// Format 1: position of the offset value's 8 bytes in `block`; format 2: of the value's
    /// length.
    offset_at: usize,
    /// Format 2: the history label's varint.
    label: Vec<u8>,
}

impl<'a> Stamper<'a> {
    /// A stamper for messages copied from `source`, upstream history `history_label`.
    pub fn new(source: &'a str, history_label: u64, format: Format) -> Self {
        let mut block = BytesMut::new();
        let mut label = BytesMut::new();
        let offset_at = match format {
            Format::Entries => {
                put_entry(&mut block, SOURCE_KEY, KIND_STRING, source.as_bytes());
                let offset_at = block.len() + entry_len(OFFSET_KEY, 8) - 8;
                put_entry(&mut block, OFFSET_KEY, KIND_UINT64, &0u64.to_le_bytes());
                put_entry(
                    &mut block,
                    CREATED_KEY,
                    KIND_UINT64,
                    &history_label.to_le_bytes(),
                );
                offset_at
            }
            Format::Compact => {
                block.put_u8(KIND_STRING);
                block.put_u32_le(COMPACT_KEY.len() as u32);
                block.put_slice(COMPACT_KEY.as_bytes());
                block.put_u8(KIND_RAW);
                let offset_at = block.len();
                block.put_u32_le(0);
                block.put_u8(COMPACT_FORMAT);
                block.put_u32_le(cluster_id(source));
                put_varint(&mut label, history_label);
                offset_at
            }
        };
        Self {
            source,
            history_label,
            format,
            block: block.to_vec(),
            offset_at,
            label: label.to_vec(),
        }
    }

    /// What [`stamp_into`] returns for this stamper's source, topic and format and `offset`.
    pub fn stamp_into(
        &self,
        arena: &mut BytesMut,
        user_headers: Option<&[u8]>,
        offset: u64,
    ) -> Option<Bytes> {
        let existing = user_headers.unwrap_or_default();
        if has_ours(existing) {
            let stamp = Stamp {
                source: self.source,
                offset,
                history_label: self.history_label,
                format: self.format,
            };
            return stamp_into(arena, user_headers, &stamp);
        }
        if existing.len() + self.tail_len(offset) > MAX_USER_HEADERS_SIZE {
            return None;
        }
        arena.clear();
        arena.reserve(existing.len() + self.tail_len(offset));
        arena.put_slice(existing);
        self.put_fresh(arena, offset);
        Some(arena.split().freeze())
    }

    /// The length of the provenance the tail writes for `offset` (on headers that carry none).
    pub fn tail_len(&self, offset: u64) -> usize {
        match self.format {
            Format::Entries => self.block.len(),
            Format::Compact => self.block.len() + varint_len(offset) + self.label.len(),
        }
    }

    /// Appends our provenance of the message at `offset` to `out`, for headers that carry none.
    fn put_fresh(&self, out: &mut BytesMut, offset: u64) {
        let at = out.len() + self.offset_at;
        out.put_slice(&self.block);
        match self.format {
            Format::Entries => out[at..at + 8].copy_from_slice(&offset.to_le_bytes()),
            Format::Compact => {
                // `block` holds the entry up to the value's length, then the value's first byte
                // and source id; the history label's varint follows the offset's.
                let value_len = (1 + 4 + varint_len(offset) + self.label.len()) as u32;
                out[at..at + 4].copy_from_slice(&value_len.to_le_bytes());
                put_varint(out, offset);
                out.put_slice(&self.label);
            }
        }
    }
}

/// A send's tail: our provenance after the user's headers, for each message that does not
/// carry provenance of ours yet (`writer::prepare` rewrote those that did: a message of another
/// hop, or one whose tail an adapter already applied).
impl replicator_sdk::HeadersTail for Stamper<'_> {
    fn write_tail(&self, m: &replicator_sdk::Message, out: &mut BytesMut) {
        if !m.user_headers.as_deref().is_some_and(has_ours) {
            self.put_fresh(out, m.offset);
        }
    }

    fn max_tail_len(&self) -> usize {
        self.tail_len(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::str::FromStr;

    use assert2::{assert, check};
    use replicator_sdk::types::{HeaderKey, HeaderValue, IggyMessage};

    use super::*;

    fn user_headers(pairs: &[(&str, &str)]) -> Bytes {
        let map: BTreeMap<HeaderKey, HeaderValue> = pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderKey::from_str(k).expect("valid key"),
                    HeaderValue::from_str(v).expect("valid value"),
                )
            })
            .collect();
        let msg = IggyMessage::builder()
            .payload(Bytes::from_static(b"x"))
            .user_headers(map)
            .build()
            .expect("valid message");
        msg.user_headers.expect("headers set")
    }

    fn stamp_of(source: &str, offset: u64) -> Stamp<'_> {
        Stamp {
            source,
            offset,
            history_label: 77,
            format: Format::Entries,
        }
    }

    fn compact_of(source: &str, offset: u64) -> Stamp<'_> {
        Stamp {
            format: Format::Compact,
            ..stamp_of(source, offset)
        }
    }

    #[test]
    fn stamp_keeps_user_entries_byte_for_byte_and_sdk_parses_result() {
        let original = user_headers(&[("trace", "abc"), ("b", "2")]);
        let stamped = stamp(Some(&original), &stamp_of("us", 42)).expect("fits");
        check!(stamped.starts_with(&original));
        let msg = IggyMessage {
            user_headers: Some(stamped.clone()),
            ..IggyMessage::from("p")
        };
        let map = msg.user_headers_map().expect("sdk parses").expect("some");
        check!(map.len() == 5);
        let found = find(Some(&stamped));
        check!(found.source == Some(ClusterRef::Alias("us")));
        check!(found.offset == Some(42));
        check!(found.origin.is_none());
        check!(found.originated_in("us"));
        check!(found.format == Some(Format::Entries));
        check!(found.history_label == Some(77));
        check!(strip(Some(&stamped)) == Some(original.to_vec()));
    }

    #[test]
    fn stamp_without_user_headers_adds_only_ours() {
        let stamped = stamp(None, &stamp_of("us", 1)).expect("fits");
        check!(strip(Some(&stamped)).is_none());
        check!(find(Some(&stamped)).offset == Some(1));
    }

    #[test]
    fn second_hop_keeps_first_origin_and_replaces_source_and_offset() {
        let first = stamp(Some(&user_headers(&[("k", "v")])), &stamp_of("us", 5)).expect("fits");
        let second = stamp(Some(&first), &stamp_of("eu", 900)).expect("fits");
        let found = find(Some(&second));
        check!(found.source == Some(ClusterRef::Alias("eu")));
        check!(found.offset == Some(900));
        check!(found.origin == Some(ClusterRef::Alias("us")));
        check!(found.originated_in("us"));
        check!(strip(Some(&second)) == Some(user_headers(&[("k", "v")]).to_vec()));
    }

    #[test]
    fn find_on_foreign_or_malformed_headers_finds_nothing() {
        check!(find(None) == Found::default());
        check!(find(Some(&user_headers(&[("repl-sourcex", "us")]))) == Found::default());
        let truncated = [2u8, 10, 0, 0, 0, b'a'];
        check!(find(Some(&truncated)) == Found::default());
        check!(strip(Some(&truncated)) == Some(truncated.to_vec()));
    }

    #[test]
    fn stamper_writes_what_stamp_writes() {
        for format in [Format::Entries, Format::Compact] {
            let stamper = Stamper::new("us", 77, format);
            let first_hop = stamp(Some(&user_headers(&[("k", "v")])), &stamp_of("eu", 5));
            let compact_hop = stamp(Some(&user_headers(&[("k", "v")])), &compact_of("eu", 5));
            let inputs = [
                None,
                Some(user_headers(&[("trace", "abc"), ("b", "2")])),
                first_hop,
                compact_hop,
            ];
            let mut arena = BytesMut::new();
            for (i, headers) in inputs.iter().enumerate() {
                let offset = 1_000 + i as u64;
                let stamp_ = Stamp {
                    format,
                    ..stamp_of("us", offset)
                };
                let general = stamp(headers.as_deref(), &stamp_);
                let fast = stamper.stamp_into(&mut arena, headers.as_deref(), offset);
                check!(fast == general, "{format:?} input {i}");
            }
            let mut big = BytesMut::new();
            put_entry(&mut big, "k", KIND_STRING, &vec![b'x'; 99_979]);
            check!(stamper.stamp_into(&mut arena, Some(&big), 1).is_none());
        }
    }

    #[test]
    fn compact_provenance_reads_back_and_costs_at_most_32_bytes() {
        let label = History::first(1_796_000_000_000_000).label();
        for (alias, offset) in [("us", 0), ("us-east-1-primary", 42), ("eu", (1 << 35) - 1)] {
            let stamp_ = Stamp {
                history_label: label,
                ..compact_of(alias, offset)
            };
            let stamped = stamp(None, &stamp_).expect("fits");
            check!(
                stamped.len() <= 32,
                "{alias} {offset}: {} bytes",
                stamped.len()
            );
            let found = find(Some(&stamped));
            check!(found.from_source(alias));
            check!(!found.from_source("ap"));
            check!(found.offset == Some(offset));
            check!(found.history_label == Some(label));
            check!(found.origin.is_none() && found.originated_in(alias));
            check!(found.format == Some(Format::Compact));
            check!(strip(Some(&stamped)).is_none());
        }
        // Against format 1's 82 bytes for the same message.
        let entries = stamp(None, &stamp_of("us", 42)).expect("fits");
        check!(entries.len() == 82);
        // Iggy's SDK parses it as one raw header.
        let msg = IggyMessage {
            user_headers: stamp(Some(&user_headers(&[("k", "v")])), &compact_of("us", 1)),
            ..IggyMessage::from("p")
        };
        check!(
            msg.user_headers_map()
                .expect("sdk parses")
                .expect("some")
                .len()
                == 2
        );
    }

    #[test]
    fn a_second_hop_keeps_the_origin_across_formats() {
        let user = user_headers(&[("k", "v")]);
        // us -> eu in format 1, eu -> ap in format 2, ap -> sa in format 1 again.
        let first = stamp(Some(&user), &stamp_of("us", 5)).expect("fits");
        let second = stamp(Some(&first), &compact_of("eu", 900)).expect("fits");
        let found = find(Some(&second));
        check!(found.from_source("eu") && found.offset == Some(900));
        check!(found.originated_in("us") && !found.originated_in("eu"));
        check!(strip(Some(&second)) == Some(user.to_vec()));
        let third = stamp(Some(&second), &stamp_of("ap", 7)).expect("fits");
        let found = find(Some(&third));
        check!(found.from_source("ap") && found.format == Some(Format::Entries));
        // Known only by id, the origin is written as `#<id>` and read back as the id.
        check!(found.origin == Some(ClusterRef::Id(cluster_id("us"))));
        check!(found.originated_in("us"));
        check!(strip(Some(&third)) == Some(user.to_vec()));
        // Restamped in its own source's format, a retried batch replaces, never adds.
        let again = stamp(Some(&second), &compact_of("eu", 900)).expect("fits");
        check!(again == second);
    }

    #[test]
    fn a_users_own_repl_header_stays_the_users() {
        let user = user_headers(&[("repl", "not ours")]);
        check!(find(Some(&user)) == Found::default());
        check!(strip(Some(&user)) == Some(user.to_vec()));
        let stamped = stamp(Some(&user), &compact_of("us", 3)).expect("fits");
        check!(stamped.starts_with(&user));
        check!(find(Some(&stamped)).offset == Some(3));
        check!(strip(Some(&stamped)) == Some(user.to_vec()));
    }

    #[test]
    fn varints_round_trip_at_every_length() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = BytesMut::new();
            put_varint(&mut buf, value);
            check!(buf.len() == varint_len(value), "{value}");
            check!(varint(&buf) == Some((value, &[][..])), "{value}");
        }
        check!(varint(&[0x80; 11]).is_none());
    }

    #[test]
    fn aliases_must_have_distinct_cluster_ids() {
        check!(distinct_cluster_ids(["us", "eu", "ap", "us"]).is_ok());
        check!(cluster_id("us") != cluster_id("eu"));
        // FNV-1a collides for these two (found by search).
        let (a, b) = colliding_pair();
        check!(cluster_id(&a) == cluster_id(&b));
        check!(distinct_cluster_ids([a.as_str(), "eu", b.as_str()]).is_err());
    }

    /// Two different short aliases with the same [`cluster_id`].
    fn colliding_pair() -> (String, String) {
        let mut seen = std::collections::HashMap::new();
        for n in 0u32.. {
            let alias = format!("c{n}");
            if let Some(other) = seen.insert(cluster_id(&alias), alias.clone()) {
                return (other, alias);
            }
        }
        unreachable!()
    }

    #[test]
    fn history_labels_keep_creation_times_and_count_resets_in_the_high_bits() {
        let created = 1_700_000_000_000_000;
        let first = History::first(created);
        // A history without resets is labelled with the creation time itself (labels of before).
        check!(first.label() == created);
        check!(History::from_label(created) == first);
        check!(first.is_of(created));
        let purged = first.next().expect("room for resets");
        check!(purged.resets == 1);
        check!(purged.label() != created);
        check!(History::from_label(purged.label()) == purged);
        check!(purged.is_of(created));
        check!(!purged.is_of(created + 1));
        // Later histories order after earlier ones.
        check!(purged > first);
        let last = History {
            created_at: created,
            resets: History::MAX_RESETS,
        };
        check!(History::from_label(last.label()) == last);
        check!(last.next().is_none());
    }

    #[test]
    fn a_copy_matches_its_original_apart_from_provenance() {
        let message = |id: u128, payload: &'static [u8], origin: u64, headers: Option<Bytes>| {
            replicator_sdk::Message::new(id, origin, Bytes::from_static(payload))
                .with_user_headers(headers)
        };
        let user = user_headers(&[("k", "v")]);
        let original = message(7, b"payload", 42, Some(user.clone()));
        let stamped = stamp(Some(&user), &stamp_of("us", 3));
        check!(same_copy(
            &original,
            &message(7, b"payload", 42, stamped.clone())
        ));
        check!(!same_copy(
            &original,
            &message(8, b"payload", 42, stamped.clone())
        ));
        check!(!same_copy(
            &original,
            &message(7, b"another", 42, stamped.clone())
        ));
        check!(!same_copy(&original, &message(7, b"payload", 43, stamped)));
        let without_user = stamp(None, &stamp_of("us", 3));
        check!(!same_copy(
            &original,
            &message(7, b"payload", 42, without_user)
        ));
    }

    #[test]
    fn stamp_refuses_to_exceed_the_header_limit() {
        let mut raw = BytesMut::new();
        put_entry(&mut raw, "k", KIND_STRING, &vec![b'x'; 99_939]);
        assert!(raw.len() == 99_950);
        check!(stamp(Some(&raw), &stamp_of("us", 1)).is_none());
    }
}

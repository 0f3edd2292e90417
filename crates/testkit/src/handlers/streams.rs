//! Stream commands, and the stream record GET_STREAM(S) and CREATE_STREAM answer with.

use super::common::{no_fields, now_micros, query_stream, stream_for, Reply, Request};
use super::topics::{purge_partitions, sum_stats, topic_record, topic_stats};
use crate::state::{Stream, Topic};
use crate::users::Action;
use crate::wire::{status, Put};

fn stream_stats(s: &Stream) -> (u64, u64) {
    sum_stats(s.topics.iter().map(|(_, t)| topic_stats(t)))
}

fn stream_record(out: &mut Vec<u8>, id: usize, s: &Stream, stats: (u64, u64)) {
    out.put_u32(id as u32);
    out.put_u64(s.created_at);
    out.put_u32(s.topics.len() as u32);
    out.put_u64(stats.0);
    out.put_u64(stats.1);
    out.put_name(&s.name);
}

pub(super) fn get_streams(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(no_fields, |meta, user, ()| {
        meta.users.check(user, Action::ReadStreams)?;
        for (id, s) in meta.streams.iter() {
            stream_record(out, id, s, stream_stats(s));
        }
        Ok(())
    })
}

pub(super) fn get_stream(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(
        |r| r.ident(),
        |meta, user, id| {
            let Some((sid, s)) = query_stream(meta, user, id, Action::ReadStream)? else {
                return Ok(());
            };
            let topic_stats: Vec<(usize, &Topic, (u64, u64))> = s
                .topics
                .iter()
                .map(|(tid, t)| (tid, t, topic_stats(t)))
                .collect();
            let total = sum_stats(topic_stats.iter().map(|(_, _, stats)| *stats));
            stream_record(out, sid, s, total);
            for (tid, t, stats) in topic_stats {
                topic_record(out, tid, t, stats);
            }
            Ok(())
        },
    )
}

pub(super) fn create_stream(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.change(
        |r| r.name(),
        |meta, user, name| {
            meta.users.check(user, Action::CreateStream)?;
            if meta.stream_by_name(name).is_some() {
                return Err(status::STREAM_NAME_ALREADY_EXISTS);
            }
            let stream = Stream {
                name: name.to_owned(),
                created_at: now_micros(),
                topics: Default::default(),
            };
            let id = meta.streams.insert(stream);
            if let Some(s) = meta.streams.get(id) {
                stream_record(out, id, s, (0, 0));
            }
            Ok(())
        },
    )
}

pub(super) fn update_stream(req: Request<'_>) -> Reply {
    req.change(
        |r| Ok((r.ident()?, r.name()?)),
        |meta, user, (id, name)| {
            let sid = stream_for(meta, user, id, Action::ManageStream)?;
            match meta.stream_by_name(name) {
                Some((other, _)) if other == sid => return Ok(()),
                Some(_) => return Err(status::STREAM_NAME_ALREADY_EXISTS),
                None => {}
            }
            if let Some(s) = meta.streams.get_mut(sid) {
                s.name = name.to_owned();
            }
            Ok(())
        },
    )
}

pub(super) fn delete_stream(req: Request<'_>) -> Reply {
    req.change(
        |r| r.ident(),
        |meta, user, id| {
            let sid = stream_for(meta, user, id, Action::ManageStream)?;
            meta.streams.remove(sid);
            meta.users.stream_deleted(sid as u32);
            req.shared.state.forget_groups(|s, _, _| s == sid);
            // The partition data goes before the metadata is rewritten, so a crash in between
            // never leaves a reused stream id pointing at the old stream's messages.
            if let Some(store) = &req.shared.store {
                store.stream_deleted(sid);
            }
            Ok(())
        },
    )
}

pub(super) fn purge_stream(req: Request<'_>) -> Reply {
    req.query(
        |r| r.ident(),
        |meta, user, id| {
            let sid = stream_for(meta, user, id, Action::ManageStream)?;
            if let Some(s) = meta.streams.get(sid) {
                for (tid, t) in s.topics.iter() {
                    purge_partitions(req.shared, sid, tid, t);
                }
            }
            Ok(())
        },
    )
}

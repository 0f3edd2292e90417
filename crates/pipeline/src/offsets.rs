//! Pure decisions about offsets, gaps and whether a writer may send. No IO, no clock: callers
//! pass `now` and the observed facts.

use std::time::{Duration, Instant};

use replicator_model::{Assignment, Epoch, InitialOffset, Offset, WorkUnit};

/// Where a reader starts and whether a jump forward there is a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadFrom {
    /// First upstream offset to poll.
    pub(crate) offset: Offset,
    /// `true` when resuming after copied data: a first polled offset above `offset` means
    /// retention removed messages before they were copied. `false` for an initial start, where
    /// the server clamping to the oldest retained message is expected.
    pub(crate) contiguous: bool,
}

/// The upstream partition's extent, from `get_topic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionExtent {
    /// Messages stored (0 = empty).
    pub(crate) messages_count: u64,
    /// Offset of the last message (meaningless when empty).
    pub(crate) current_offset: Offset,
}

impl PartitionExtent {
    /// The offset the next appended message gets.
    pub(crate) fn next_offset(&self) -> Offset {
        if self.messages_count == 0 {
            0
        } else {
            self.current_offset.saturating_add(1)
        }
    }
}

/// Where a unit resumes: after the highest of the confirmed offset and the last offset found
/// downstream (both already filtered to the current topic incarnation), else at the flow's
/// initial offset.
pub(crate) fn plan_resume(
    confirmed: Option<Offset>,
    downstream_tail: Option<Offset>,
    initial: InitialOffset,
    upstream: PartitionExtent,
) -> ReadFrom {
    match confirmed.max(downstream_tail) {
        Some(last) => ReadFrom {
            offset: last.saturating_add(1),
            contiguous: true,
        },
        None => ReadFrom {
            offset: match initial {
                InitialOffset::Earliest => 0,
                InitialOffset::Latest => upstream.next_offset(),
                InitialOffset::At(offset) => offset,
            },
            contiguous: false,
        },
    }
}

/// Offsets removed by retention before they were copied (inclusive range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// First lost offset.
    pub from: Offset,
    /// Last lost offset.
    pub to: Offset,
}

impl Gap {
    /// Number of lost offsets.
    pub fn len(&self) -> u64 {
        self.to - self.from + 1
    }

    /// Always `false`: a gap holds at least one offset.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A poll asked for `requested` and got `first_returned` first: the lost range, if any.
pub(crate) fn detect_gap(requested: ReadFrom, first_returned: Offset) -> Option<Gap> {
    (requested.contiguous && first_returned > requested.offset).then(|| Gap {
        from: requested.offset,
        to: first_returned - 1,
    })
}

/// Why a writer may not send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendVeto {
    /// The unit is no longer assigned to this node under the writer's epoch.
    EpochNotCurrent,
    /// The node's lease is missing or ends within the safety margin.
    LeaseExpiring,
}

/// Whether a writer holding `epoch` may send now.
pub(crate) fn may_send(
    now: Instant,
    lease_valid_until: Option<Instant>,
    margin: Duration,
    epoch_current: bool,
) -> Result<(), SendVeto> {
    if !epoch_current {
        return Err(SendVeto::EpochNotCurrent);
    }
    match lease_valid_until {
        Some(until) if until > now + margin => Ok(()),
        _ => Err(SendVeto::LeaseExpiring),
    }
}

/// Whether `unit` is assigned under `epoch` in `assignments`.
pub(crate) fn epoch_is_current(assignments: &[Assignment], unit: &WorkUnit, epoch: Epoch) -> bool {
    assignments
        .iter()
        .any(|a| a.epoch == epoch && a.unit == *unit)
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    const EMPTY: PartitionExtent = PartitionExtent {
        messages_count: 0,
        current_offset: 0,
    };
    const TEN: PartitionExtent = PartitionExtent {
        messages_count: 10,
        current_offset: 9,
    };

    #[test]
    fn resume_after_highest_of_confirmed_and_tail() {
        check!(
            plan_resume(Some(5), Some(8), InitialOffset::Earliest, TEN)
                == ReadFrom {
                    offset: 9,
                    contiguous: true
                }
        );
        check!(plan_resume(Some(8), Some(5), InitialOffset::Latest, TEN).offset == 9);
        check!(plan_resume(None, Some(0), InitialOffset::Latest, TEN).offset == 1);
        check!(plan_resume(Some(3), None, InitialOffset::At(100), TEN).offset == 4);
    }

    #[test]
    fn no_progress_starts_at_initial_offset_without_gap_detection() {
        let earliest = plan_resume(None, None, InitialOffset::Earliest, TEN);
        check!(
            earliest
                == ReadFrom {
                    offset: 0,
                    contiguous: false
                }
        );
        check!(plan_resume(None, None, InitialOffset::Latest, TEN).offset == 10);
        check!(plan_resume(None, None, InitialOffset::Latest, EMPTY).offset == 0);
        check!(plan_resume(None, None, InitialOffset::At(42), TEN).offset == 42);
    }

    #[test]
    fn gap_only_when_resuming_and_first_offset_jumps() {
        let resume = ReadFrom {
            offset: 100,
            contiguous: true,
        };
        check!(detect_gap(resume, 100).is_none());
        check!(detect_gap(resume, 150) == Some(Gap { from: 100, to: 149 }));
        check!(detect_gap(resume, 150).map(|g| g.len()) == Some(50));
        let initial = ReadFrom {
            offset: 0,
            contiguous: false,
        };
        check!(detect_gap(initial, 56).is_none());
    }

    #[test]
    fn may_send_needs_current_epoch_and_lease_beyond_margin() {
        let now = Instant::now();
        let margin = Duration::from_millis(500);
        check!(may_send(now, Some(now + Duration::from_secs(2)), margin, true).is_ok());
        check!(
            may_send(now, Some(now + Duration::from_millis(400)), margin, true)
                == Err(SendVeto::LeaseExpiring)
        );
        check!(may_send(now, None, margin, true) == Err(SendVeto::LeaseExpiring));
        check!(
            may_send(now, Some(now + Duration::from_secs(2)), margin, false)
                == Err(SendVeto::EpochNotCurrent)
        );
    }

    #[test]
    fn epoch_is_current_matches_unit_and_epoch() {
        let u = WorkUnit::new("f", "s", "t", 1);
        let a = vec![Assignment {
            unit: u.clone(),
            epoch: Epoch(4),
            release_requested: true,
        }];
        check!(epoch_is_current(&a, &u, Epoch(4)));
        check!(!epoch_is_current(&a, &u, Epoch(3)));
        check!(!epoch_is_current(
            &a,
            &WorkUnit::new("f", "s", "t", 2),
            Epoch(4)
        ));
    }
}

//! Where the target says a writer's sends landed. An Iggy 0.9 server answers every send with a
//! confirmation (the partition and the offset of the batch's first message); Iggy 0.8 answers
//! nothing. One writer is the only one appending to its partition (the epoch fence, and the
//! target fence where it is on), so each confirmed send must start exactly where the previous
//! one ended. A send that landed elsewhere means something else appended to, purged or rewound
//! the partition between two sends: the writer treats it like a send whose outcome it does not
//! know and re-reads the partition's tail before sending again, so that what it copies next
//! follows what the target really holds.

use replicator_sdk::Confirmed;

use crate::error::LandedMismatch;

/// What the confirmations of one writer's sends said so far.
#[derive(Debug, Default)]
pub(crate) struct LandedCheck {
    /// The offset the next confirmed send must start at; `None` until a confirmation told
    /// (after a start, a tail re-read, or an answer without a confirmation).
    next: Option<u64>,
}

impl LandedCheck {
    /// Checks the confirmations of one send to `partition` (one entry per request the send
    /// took, in order; none on Iggy 0.8). After a mismatch the check starts over, as after
    /// [`LandedCheck::forget`].
    pub(crate) fn confirm(
        &mut self,
        partition: u32,
        sends: &[Confirmed],
    ) -> Result<(), LandedMismatch> {
        for send in sends {
            let outcome = self.confirm_one(partition, send);
            if outcome.is_err() {
                self.next = None;
                return outcome;
            }
        }
        Ok(())
    }

    fn confirm_one(&mut self, partition: u32, send: &Confirmed) -> Result<(), LandedMismatch> {
        match send.places.as_slice() {
            // The server answered without saying where (a replayed request answered from its
            // cache): the messages landed once, but where is not known.
            [] => self.next = None,
            [place] if place.partition != partition => {
                return Err(LandedMismatch::Partition {
                    sent: partition,
                    landed: place.partition,
                })
            }
            [place] => {
                if let Some(expected) = self.next.filter(|next| *next != place.base_offset) {
                    return Err(LandedMismatch::Offset {
                        expected,
                        landed: place.base_offset,
                    });
                }
                self.next = Some(place.base_offset + u64::from(send.messages));
            }
            several => return Err(LandedMismatch::Several(several.len())),
        }
        Ok(())
    }

    /// Forgets where the next send must start: the writer re-read the tail, or a send failed.
    pub(crate) fn forget(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use replicator_sdk::Place;

    fn at(partition: u32, base_offset: u64, messages: u32) -> Confirmed {
        Confirmed {
            messages,
            places: vec![Place {
                partition,
                base_offset,
            }],
        }
    }

    #[test]
    fn consecutive_sends_that_follow_each_other_pass() {
        let mut check = LandedCheck::default();
        assert_eq!(check.confirm(3, &[at(3, 0, 10)]), Ok(()));
        assert_eq!(check.confirm(3, &[at(3, 10, 5), at(3, 15, 1)]), Ok(()));
        assert_eq!(check.confirm(3, &[at(3, 16, 1)]), Ok(()));
    }

    #[test]
    fn the_first_confirmation_after_a_start_sets_where_the_next_must_land() {
        let mut check = LandedCheck::default();
        assert_eq!(check.confirm(0, &[at(0, 700, 2)]), Ok(()));
        assert_eq!(
            check.confirm(0, &[at(0, 703, 1)]),
            Err(LandedMismatch::Offset {
                expected: 702,
                landed: 703
            })
        );
    }

    #[test]
    fn a_send_that_landed_after_someone_elses_append_is_reported_and_the_check_starts_over() {
        let mut check = LandedCheck::default();
        check.confirm(1, &[at(1, 0, 4)]).unwrap();
        assert_eq!(
            check.confirm(1, &[at(1, 9, 4)]),
            Err(LandedMismatch::Offset {
                expected: 4,
                landed: 9
            })
        );
        // The writer re-reads the tail; the next confirmation is taken as it comes.
        assert_eq!(check.confirm(1, &[at(1, 13, 1)]), Ok(()));
    }

    #[test]
    fn a_purged_partition_that_restarts_at_zero_is_reported() {
        let mut check = LandedCheck::default();
        check.confirm(2, &[at(2, 50, 10)]).unwrap();
        assert_eq!(
            check.confirm(2, &[at(2, 0, 10)]),
            Err(LandedMismatch::Offset {
                expected: 60,
                landed: 0
            })
        );
    }

    #[test]
    fn a_mismatch_in_the_first_part_of_a_split_send_is_reported() {
        let mut check = LandedCheck::default();
        check.confirm(0, &[at(0, 0, 2)]).unwrap();
        assert!(check.confirm(0, &[at(0, 5, 2), at(0, 7, 2)]).is_err());
    }

    #[test]
    fn a_confirmation_of_another_partition_is_reported() {
        let mut check = LandedCheck::default();
        assert_eq!(
            check.confirm(4, &[at(5, 0, 1)]),
            Err(LandedMismatch::Partition { sent: 4, landed: 5 })
        );
    }

    #[test]
    fn several_confirmations_for_one_send_are_reported() {
        let mut check = LandedCheck::default();
        let send = Confirmed {
            messages: 2,
            places: vec![
                Place {
                    partition: 0,
                    base_offset: 0,
                },
                Place {
                    partition: 0,
                    base_offset: 1,
                },
            ],
        };
        assert_eq!(check.confirm(0, &[send]), Err(LandedMismatch::Several(2)));
    }

    #[test]
    fn an_answer_without_a_confirmation_or_a_forget_drops_what_was_known() {
        let mut check = LandedCheck::default();
        check.confirm(0, &[at(0, 0, 3)]).unwrap();
        let silent = Confirmed {
            messages: 3,
            places: Vec::new(),
        };
        assert_eq!(check.confirm(0, &[silent]), Ok(()));
        assert_eq!(check.confirm(0, &[at(0, 40, 1)]), Ok(()));
        check.forget();
        assert_eq!(check.confirm(0, &[at(0, 90, 1)]), Ok(()));
    }

    #[test]
    fn iggy_0_8_sends_confirm_nothing_and_pass() {
        let mut check = LandedCheck::default();
        assert_eq!(check.confirm(0, &[]), Ok(()));
        assert_eq!(check.confirm(0, &[]), Ok(()));
    }
}

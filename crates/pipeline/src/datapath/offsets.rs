//! Where a reader starts and what a jump in the offsets it polls means (a gap). Pure: the
//! writer decides the start (`writer::resume`), the reader feeds the offsets it got.

use replicator_model::Offset;

use crate::stats::Gap;

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

/// A poll asked for `requested` and got `first_returned` first: the lost range, if any.
pub(crate) fn detect_gap(requested: ReadFrom, first_returned: Offset) -> Option<Gap> {
    (requested.contiguous && first_returned > requested.offset).then(|| Gap {
        from: requested.offset,
        to: first_returned - 1,
    })
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

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
}

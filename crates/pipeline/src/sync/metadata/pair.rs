//! Two-way pairs, the decisions: a flow from `a` to `b` and one from `b` to `a` both sync the
//! users and topic settings they both select, so each object has two writers. Without a rule
//! the two fight: the copy of a user (inactive by design) reads as an original to the reverse
//! flow, which "syncs" its status home; an operator's change on one side is undone by the
//! reverse flow before the forward flow carries it.
//!
//! The rules, kept in the control plane per pair and object
//! ([`MetadataRecord`](replicator_model::MetadataRecord)):
//! - **Every object has a home**, the cluster where it was authored; the other side holds a
//!   copy. A flow copies an object only from its home: a flow whose target is the home leaves
//!   the object alone (the reverse flow syncs it). Not recorded yet, the home is found once
//!   and recorded ([`user_home`], and for topics the older of the two topics). `flow promote`
//!   moves the homes of what the flow syncs to its target.
//! - **Users follow their home** (status and permissions): a copy is not authored, so a
//!   change made to it is undone by the next round.
//! - **Topic settings: changes, not states, travel.** The pair records, per setting, the
//!   value both sides had when they last agreed. A side whose value differs from it changed;
//!   the flow whose source changed carries the change, the other leaves it. A change on both
//!   sides to different values is a **conflict**: reported, and the home's value wins, so
//!   the two flows never undo each other ([`plan_settings`]).

use std::collections::BTreeSet;

use replicator_model::{MetadataRecord, TopicSetting};
use replicator_sdk::types::UserStatus;
use serde::{Deserialize, Serialize};

use super::settings::{SettingDifference, TopicSettings};
use super::users::UserCopy;
use crate::selection::pairing::{PairView, Side};

/// Where a user of a pair is at home, as one flow finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UserHome {
    /// As recorded.
    Recorded(Side),
    /// Not recorded: found on this side, to be recorded before anything is done with it.
    Found(Side),
    /// Not recorded, and nothing tells: the same status and creation time on both sides (a
    /// copy is inactive until promote, so exactly one active side is the home; otherwise the
    /// older one is, as a copy is made from its original). Left alone, reported.
    Undecided(String),
    /// Recorded, and neither side has it any more: the record is dropped.
    Gone,
}

/// Decides where the user (`up` on the flow's source, `down` on its target) is at home.
pub(crate) fn user_home(
    view: &PairView,
    record: Option<&MetadataRecord>,
    up: Option<&UserCopy>,
    down: Option<&UserCopy>,
) -> UserHome {
    if let Some(record) = record {
        if up.is_none() && down.is_none() {
            return UserHome::Gone;
        }
        return match view.side(&record.home) {
            Some(side) => UserHome::Recorded(side),
            None => UserHome::Undecided(format!(
                "recorded at home on {}, which is neither {} nor {}",
                record.home, view.source, view.target
            )),
        };
    }
    match (up, down) {
        (Some(_), None) => UserHome::Found(Side::Source),
        (None, Some(_)) => UserHome::Found(Side::Target),
        (Some(up), Some(down)) => match (up.status, down.status) {
            (UserStatus::Active, UserStatus::Inactive) => UserHome::Found(Side::Source),
            (UserStatus::Inactive, UserStatus::Active) => UserHome::Found(Side::Target),
            // Both active (promoted by hand) or both inactive (an original an operator
            // deactivated, and its copy): the copy was made from the original, later.
            _ => match up.created_at.cmp(&down.created_at) {
                std::cmp::Ordering::Less => UserHome::Found(Side::Source),
                std::cmp::Ordering::Greater => UserHome::Found(Side::Target),
                std::cmp::Ordering::Equal => UserHome::Undecided(format!(
                    "on both {} and {} with the same status and creation time, and no home \
                     recorded: delete the one that is a copy (the sync creates it again, \
                     inactive)",
                    view.source, view.target
                )),
            },
        },
        (None, None) => UserHome::Gone,
    }
}

/// A setting both sides changed, to different values, since the pair last agreed on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingConflict {
    /// The setting, e.g. `message_expiry`.
    pub setting: String,
    /// The value on the flow's source, rendered.
    pub source: String,
    /// The value on the flow's target, rendered.
    pub target: String,
    /// The alias of the cluster whose value wins (the topic's home).
    pub winner: String,
    /// This flow applied the winner's value (it is the one whose source is the home); the
    /// other flow of the pair reports the same conflict without changing anything.
    pub applied_here: bool,
}

/// What a topic of a pair needs from one flow's round.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairSettingsPlan {
    /// The settings to send to the target (`None`: nothing to change).
    pub(crate) update: Option<TopicSettings>,
    /// The settings the update changes.
    pub(crate) changed: Vec<TopicSetting>,
    /// Settings changed on the target since the pair last agreed: the reverse flow carries
    /// them to this flow's source.
    pub(crate) left_to_reverse: Vec<TopicSetting>,
    /// Both sides changed.
    pub(crate) conflicts: Vec<SettingConflict>,
    /// Differences kept on purpose (`keep_target_settings` of either flow).
    pub(crate) kept: Vec<SettingDifference>,
    /// The record once the update landed.
    pub(crate) record: MetadataRecord,
}

impl PairSettingsPlan {
    /// The record to store after the update: `refused` settings keep what was agreed before.
    pub(crate) fn record_after(
        &self,
        refused: &[TopicSetting],
        before: Option<&MetadataRecord>,
    ) -> MetadataRecord {
        let mut record = self.record.clone();
        for setting in refused {
            let key = setting.as_str();
            match before.and_then(|b| b.agreed.get(key)) {
                Some(&value) => record.agreed.insert(key.to_owned(), value),
                None => record.agreed.remove(key),
            };
        }
        record
    }
}

/// Decides one topic of a pair for the flow from `up` (its source's settings) to `down` (its
/// target's). `older`: the side whose topic was created first, the home when none is
/// recorded. `keep`: the settings either flow of the pair keeps (`keep_target_settings`),
/// which travel in neither direction.
pub(crate) fn plan_settings(
    view: &PairView,
    up: &TopicSettings,
    down: &TopicSettings,
    record: Option<&MetadataRecord>,
    older: Side,
    keep: &BTreeSet<TopicSetting>,
) -> PairSettingsPlan {
    let home = record.and_then(|r| view.side(&r.home)).unwrap_or(older);
    let mut plan = PairSettingsPlan {
        update: None,
        changed: Vec::new(),
        left_to_reverse: Vec::new(),
        conflicts: Vec::new(),
        kept: Vec::new(),
        record: MetadataRecord {
            home: view.alias(home).to_owned(),
            agreed: record.map(|r| r.agreed.clone()).unwrap_or_default(),
        },
    };
    let mut wanted = *down;
    for setting in TopicSetting::ALL {
        let (s, t) = (up.encoded(setting), down.encoded(setting));
        let key = setting.as_str();
        if keep.contains(&setting) {
            if s != t {
                plan.kept.push(SettingDifference {
                    setting: key.to_owned(),
                    upstream: up.render(setting),
                    target: down.render(setting),
                    kept: true,
                });
            }
            continue;
        }
        // A side that reports "its server's default" has no value of its own to agree on.
        if !up.stated(setting) || !down.stated(setting) {
            continue;
        }
        if s == t {
            plan.record.agreed.insert(key.to_owned(), s);
            continue;
        }
        let agreed = record.and_then(|r| r.agreed.get(key)).copied();
        let take_source = if agreed == Some(t) {
            true
        } else if agreed == Some(s) {
            plan.left_to_reverse.push(setting);
            false
        } else {
            plan.conflicts.push(SettingConflict {
                setting: key.to_owned(),
                source: up.render(setting),
                target: down.render(setting),
                winner: view.alias(home).to_owned(),
                applied_here: home == Side::Source,
            });
            home == Side::Source
        };
        if take_source {
            wanted = wanted.with(setting, up);
            plan.changed.push(setting);
            plan.record.agreed.insert(key.to_owned(), s);
        }
    }
    plan.update = (!plan.changed.is_empty()).then_some(wanted);
    plan
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use replicator_sdk::types::{CompressionAlgorithm, IggyExpiry, MaxTopicSize};

    use super::*;

    fn view() -> PairView {
        PairView::new("us", "eu")
    }

    fn user(status: UserStatus) -> UserCopy {
        UserCopy {
            id: 7,
            created_at: 100,
            status,
            permissions: None,
        }
    }

    fn settings(expiry_s: u64) -> TopicSettings {
        TopicSettings {
            message_expiry: IggyExpiry::ExpireDuration(
                std::time::Duration::from_secs(expiry_s).into(),
            ),
            max_topic_size: MaxTopicSize::Unlimited,
            compression: CompressionAlgorithm::None,
        }
    }

    fn agreed(home: &str, expiry_s: u64) -> MetadataRecord {
        let s = settings(expiry_s);
        MetadataRecord {
            home: home.into(),
            agreed: TopicSetting::ALL
                .iter()
                .map(|&k| (k.as_str().to_owned(), s.encoded(k)))
                .collect(),
        }
    }

    #[test]
    fn the_active_side_of_an_unrecorded_user_is_its_home() {
        let (active, inactive) = (user(UserStatus::Active), user(UserStatus::Inactive));
        // The bug of issue 47: eu-to-us read eu's inactive copy as an original.
        let eu_to_us = PairView::new("eu", "us");
        check!(
            user_home(&eu_to_us, None, Some(&inactive), Some(&active))
                == UserHome::Found(Side::Target)
        );
        check!(user_home(&view(), None, Some(&active), None) == UserHome::Found(Side::Source));
        check!(user_home(&view(), None, None, Some(&inactive)) == UserHome::Found(Side::Target));
        check!(matches!(
            user_home(&view(), None, Some(&active), Some(&active)),
            UserHome::Undecided(_)
        ));
        check!(matches!(
            user_home(&view(), None, Some(&inactive), Some(&inactive)),
            UserHome::Undecided(_)
        ));
        // The same status: the older one is the original (a copy is made from it).
        let newer = UserCopy {
            created_at: 200,
            ..inactive.clone()
        };
        check!(
            user_home(&view(), None, Some(&inactive), Some(&newer))
                == UserHome::Found(Side::Source)
        );
        check!(
            user_home(&view(), None, Some(&newer), Some(&inactive))
                == UserHome::Found(Side::Target)
        );
    }

    #[test]
    fn a_recorded_home_stands_whatever_the_statuses() {
        let record = view().home_at(Side::Target);
        let active = user(UserStatus::Active);
        // After promote both sides are active; the record says which one is authored.
        check!(
            user_home(&view(), Some(&record), Some(&active), Some(&active))
                == UserHome::Recorded(Side::Target)
        );
        check!(user_home(&view(), Some(&record), None, None) == UserHome::Gone);
        let stranger = MetadataRecord {
            home: "ap".into(),
            ..MetadataRecord::default()
        };
        check!(matches!(
            user_home(&view(), Some(&stranger), Some(&active), None),
            UserHome::Undecided(_)
        ));
    }

    #[test]
    fn a_change_on_the_source_travels_and_is_recorded() {
        let record = agreed("us", 60);
        let plan = plan_settings(
            &view(),
            &settings(7 * 86_400),
            &settings(60),
            Some(&record),
            Side::Source,
            &BTreeSet::new(),
        );
        check!(plan.changed == vec![TopicSetting::MessageExpiry]);
        check!(plan.update == Some(settings(7 * 86_400)));
        check!(plan.conflicts.is_empty());
        check!(plan.record == agreed("us", 7 * 86_400));
    }

    #[test]
    fn a_change_on_the_target_is_left_to_the_reverse_flow() {
        // The race of issue 47: the reverse flow ran first and must not push the old value.
        let record = agreed("us", 60);
        let eu_to_us = PairView::new("eu", "us");
        let plan = plan_settings(
            &eu_to_us,
            &settings(60),
            &settings(7 * 86_400),
            Some(&record),
            Side::Target,
            &BTreeSet::new(),
        );
        check!(plan.update == None);
        check!(plan.left_to_reverse == vec![TopicSetting::MessageExpiry]);
        check!(plan.record == record);
        // Even when the target is the home: a change on the copy side travels home too.
        let plan = plan_settings(
            &view(),
            &settings(60),
            &settings(3_600),
            Some(&agreed("eu", 60)),
            Side::Target,
            &BTreeSet::new(),
        );
        check!(plan.update == None);
        check!(plan.left_to_reverse == vec![TopicSetting::MessageExpiry]);
    }

    #[test]
    fn both_sides_changed_is_a_conflict_the_home_wins() {
        let record = agreed("us", 60);
        let (us_value, eu_value) = (settings(3_600), settings(7_200));
        let forward = plan_settings(
            &view(),
            &us_value,
            &eu_value,
            Some(&record),
            Side::Target,
            &BTreeSet::new(),
        );
        check!(forward.update == Some(us_value));
        check!(forward.conflicts.len() == 1);
        check!(forward.conflicts[0].winner == "us");
        check!(forward.conflicts[0].applied_here);
        let reverse = plan_settings(
            &PairView::new("eu", "us"),
            &eu_value,
            &us_value,
            Some(&record),
            Side::Source,
            &BTreeSet::new(),
        );
        check!(reverse.update == None);
        check!(reverse.conflicts.len() == 1);
        check!(reverse.conflicts[0].winner == "us");
        check!(!reverse.conflicts[0].applied_here);
    }

    #[test]
    fn without_a_record_the_older_topic_is_the_home() {
        let forward = plan_settings(
            &view(),
            &settings(60),
            &settings(120),
            None,
            Side::Target,
            &BTreeSet::new(),
        );
        check!(forward.update == None);
        check!(forward.record.home == "eu");
        check!(forward.conflicts.len() == 1);
        let equal = plan_settings(
            &view(),
            &settings(60),
            &settings(60),
            None,
            Side::Source,
            &BTreeSet::new(),
        );
        check!(equal.update == None);
        check!(equal.record == agreed("us", 60));
    }

    #[test]
    fn kept_settings_travel_in_neither_direction() {
        let keep = BTreeSet::from([TopicSetting::MessageExpiry]);
        let plan = plan_settings(
            &view(),
            &settings(60),
            &settings(120),
            Some(&agreed("us", 30)),
            Side::Source,
            &keep,
        );
        check!(plan.update == None);
        check!(plan.kept.len() == 1);
        check!(plan.conflicts.is_empty());
    }

    #[test]
    fn a_refused_setting_keeps_what_was_agreed() {
        let record = agreed("us", 60);
        let plan = plan_settings(
            &view(),
            &settings(120),
            &settings(60),
            Some(&record),
            Side::Source,
            &BTreeSet::new(),
        );
        check!(plan.record_after(&[TopicSetting::MessageExpiry], Some(&record)) == record);
    }
}

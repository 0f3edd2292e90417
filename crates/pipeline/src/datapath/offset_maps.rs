//! The writers' offset maps on this node ([`OffsetMap`]: what a writer sent since it resumed),
//! shared with the consumer-group sync, which reads them to translate a group's offset without
//! a search (`sync::groups`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use replicator_model::{Offset, WorkUnit};

use super::translate::{Copied, Lookup, OffsetMap};
use crate::params::FlowParams;

/// One writer's [`OffsetMap`], shared with the sync (the writer locks only its own).
pub(crate) type SharedOffsetMap = Arc<Mutex<OffsetMap>>;

/// Locks a writer's map.
pub(crate) fn lock_map(map: &SharedOffsetMap) -> std::sync::MutexGuard<'_, OffsetMap> {
    map.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writers' [`OffsetMap`]s of this node, by unit (a map outlives its writer until the
/// unit's next writer resumes: `flow promote` uses the maps of the writers it paused).
#[derive(Clone, Default)]
pub(crate) struct OffsetMaps(Arc<Mutex<HashMap<WorkUnit, SharedOffsetMap>>>);

impl OffsetMaps {
    /// A writer of `unit` resumed: it records its sends in the returned map from now on.
    pub(crate) fn resumed(&self, unit: &WorkUnit, map: OffsetMap) -> SharedOffsetMap {
        let map = Arc::new(Mutex::new(map));
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(unit.clone(), map.clone());
        map
    }

    /// The map of `unit`'s latest writer.
    pub(crate) fn get(&self, unit: &WorkUnit) -> Option<SharedOffsetMap> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(unit)
            .cloned()
    }

    pub(crate) fn label(&self, unit: &WorkUnit) -> Option<u64> {
        Some(lock_map(&self.get(unit)?).label())
    }

    pub(crate) fn newest(&self, unit: &WorkUnit) -> Option<(u64, Copied)> {
        let map = self.get(unit)?;
        let map = lock_map(&map);
        Some((map.label(), map.newest()?))
    }

    pub(crate) fn lookup(&self, unit: &WorkUnit, label: u64, up: Offset) -> Lookup {
        match self.get(unit) {
            Some(map) => {
                let map = lock_map(&map);
                if map.label() == label {
                    map.lookup(up)
                } else {
                    Lookup::Unknown
                }
            }
            None => Lookup::Unknown,
        }
    }
}

/// Whether `flow` syncs consumer groups, so that its writers keep offset maps: syncing is
/// pointless without provenance (nothing to translate with).
pub(crate) fn enabled(flow: &FlowParams) -> bool {
    flow.provenance && !flow.consumer_groups.is_empty()
}

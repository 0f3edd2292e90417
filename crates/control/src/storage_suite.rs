//! openraft's storage test suite against the sled log store and state machine.

use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use replicator_model::NodeId;

use crate::log_store::LogStore;
use crate::state_machine::{Shared, StateMachineStore};
use crate::{data_dir, TypeConfig};

/// Builds a fresh store on its own temp dir (the guard keeps the dir alive).
struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let fail = |e: crate::Error| {
            StorageError::from(StorageIOError::write(openraft::AnyError::error(e)))
        };
        let dir = tempfile::tempdir()
            .map_err(|e| StorageError::from(StorageIOError::write(openraft::AnyError::new(&e))))?;
        let db = data_dir::open(dir.path()).map_err(fail)?;
        let log = LogStore::open(&db, dir.path()).map_err(fail)?;
        let sm = StateMachineStore::open(
            &db,
            dir.path(),
            Shared::new(1, crate::identity::test_passwords(), 0),
        )
        .map_err(fail)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_sled() -> Result<(), Box<dyn std::error::Error>> {
    Suite::test_all(SledBuilder).map_err(|e| e.to_string().into())
}

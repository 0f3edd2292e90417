//! Fencing on the target clusters, the pipeline's side: only the current owner of a unit can
//! write to its target. [`fence`] provisions and revokes the writer users on a target
//! (the control plane's leader drives it through the binary); [`identity`] keeps this node's
//! writer connections logged in as its current writer identity and closes the old ones for good;
//! [`handover`] keeps a starting pipeline from taking up or handing back a unit while an
//! earlier writer's last sends can still land.
//! See ARCHITECTURE.md, "Never two owners" ("Fencing at the target").

pub(crate) mod fence;
pub(crate) mod handover;
pub(crate) mod identity;

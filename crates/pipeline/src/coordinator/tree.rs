//! The shape of the tree as it runs ([`draw_tree`]), which the test of ARCHITECTURE.md's
//! drawing reads: above every actor of the tree, it knows each one's message type.

use super::flow::FlowMsg;
use super::loop_actor::LoopMsg;
use super::supervisor::SupervisorMsg;
use super::tasks::TasksMsg;
use super::CoordinatorMsg;

/// The shape of the tree under `root` as it runs, one line per kind of actor with how many run
/// under the same parent (`Flow ×2`), for the test that keeps ARCHITECTURE.md's drawing true.
/// A kind is told by the actor's message type; a group's subtree is drawn from its first actor.
pub(crate) fn draw_tree(root: &ractor::ActorCell) -> String {
    fn label(cell: &ractor::ActorCell) -> &'static str {
        let is = |yes: Option<bool>| yes == Some(true);
        if is(cell.is_message_type_of::<SupervisorMsg>()) {
            "Supervisor"
        } else if is(cell.is_message_type_of::<CoordinatorMsg>()) {
            "Coordinator"
        } else if is(cell.is_message_type_of::<FlowMsg>()) {
            "Flow"
        } else if is(cell.is_message_type_of::<TasksMsg>()) {
            "Tasks"
        } else if is(cell.is_message_type_of::<LoopMsg>()) {
            "LoopActor"
        } else {
            "?"
        }
    }
    fn draw(cell: &ractor::ActorCell, prefix: &str, out: &mut String) {
        let mut groups: Vec<(&'static str, Vec<ractor::ActorCell>)> = Vec::new();
        for child in cell.get_children() {
            let l = label(&child);
            match groups.iter_mut().find(|(g, _)| *g == l) {
                Some((_, cells)) => cells.push(child),
                None => groups.push((l, vec![child])),
            }
        }
        groups.sort_by_key(|(l, _)| *l);
        let last = groups.len().saturating_sub(1);
        for (i, (l, cells)) in groups.iter().enumerate() {
            let (branch, next) = if i == last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            out.push_str(&format!("{prefix}{branch}{l} ×{}\n", cells.len()));
            draw(&cells[0], &format!("{prefix}{next}"), out);
        }
    }
    let mut out = format!("{}\n", label(root));
    draw(root, "", &mut out);
    out
}

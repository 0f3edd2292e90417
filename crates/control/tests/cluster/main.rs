//! Control-plane cluster tests: real sled dirs, real loopback sockets, in-process nodes.

mod util;

mod basic;
mod faults;
mod fencing;
mod membership;
mod rpc_auth;
mod stress;
mod tls;

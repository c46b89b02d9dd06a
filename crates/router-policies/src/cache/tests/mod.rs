//! Cache-aware selection over a real prefix index and load table: the rules as tables, the
//! lookup outcomes and memo, properties, and the remote source over loopback gRPC.

pub(crate) mod fixture;
mod outcomes;
mod props;
mod remote;
mod rules;

//! End-to-end tests of the `router-sim` binary: real processes on loopback ports, spoken to
//! over HTTP, ZeroMQ and gRPC.

mod api_key;
mod chat;
mod common;
mod completions;
mod faults;
mod generate;
mod kv;
mod loadgen;
mod pd;
mod reporter;
mod tls;
mod trace;

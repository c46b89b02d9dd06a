//! End-to-end tests of the `router-sim` binary: real processes on loopback ports, spoken to
//! over HTTP and ZeroMQ.

mod chat;
mod common;
mod faults;
mod kv;
mod loadgen;
mod pd;

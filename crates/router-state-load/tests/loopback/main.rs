//! Loopback tests: real tonic reporters and clients, and real HTTP servers for `/v1/loads` and
//! vLLM's `/metrics`, on 127.0.0.1 with ports chosen by the OS.

mod common;
mod grpc;
mod poll;
mod service;
mod vllm;

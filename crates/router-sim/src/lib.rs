//! A simulated LLM inference engine and a workload generator.
//!
//! Owns the engine model used by the demo, the benchmarks and the end-to-end tests: an OpenAI
//! HTTP front, a prefix cache with a timing model, KV events over ZeroMQ and gRPC load reports.
//! It encodes KV events with its own code, never router-state-kv's.
//!
//! Does not own: anything the router does.

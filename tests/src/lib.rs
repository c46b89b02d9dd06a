//! Helpers for the end-to-end tests: spawning router-server and router-sim processes on
//! loopback ports and talking to them over HTTP. Owns no product behaviour.

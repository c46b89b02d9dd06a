//! Engine load state: reports streamed by engines and router-local accounting.
//!
//! Owns the load-report subscriptions, the `EngineReportedLoadTable` (freshness, rank
//! aggregation, basic versus native reports) and router-local in-flight accounting.
//!
//! Does not own: selection or admission decisions (router-policies), health (router-workers).

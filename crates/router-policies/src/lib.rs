//! Engine selection policies and admission.
//!
//! Owns the `Policy` contract (`PickRequest`, `Pick`, `PickError`), admission
//! (`AdmissionLimits`, `EngineAdmission`), the concrete policies and their construction from
//! configuration, and the cache-source adapter with its per-request memo.
//!
//! Does not own: bucket resolution (router-buckets), shared state ingestion (the state crates),
//! or dispatch (router-server).

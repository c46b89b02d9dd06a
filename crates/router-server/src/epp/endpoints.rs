//! Engines as Envoy names them: `ip:port`. A worker's endpoint is the authority of its URL; the
//! subset hint Envoy sends (`envoy.lb.subset_hint`, key `x-gateway-destination-endpoint-subset`)
//! is a list of endpoints, resolved here to the workers that have them.

use std::collections::HashMap;

use prost_types::value::Kind;
use router_proto::envoy::config::core::v3::Metadata;
use router_workers::{Worker, WorkerId, WorkerRegistry};

/// The metadata namespace of the subset hint.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint, and the prefix of the destination header's name.
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The request header (and `envoy.lb` metadata key) carrying the pick and its fallbacks.
pub(crate) const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the pick, for Envoy's load balancer.
pub(crate) const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// The request header carrying a PD pair's prefill engine to the decode-side sidecar.
pub(crate) const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// `host:port` of `worker`'s URL, the port defaulted by scheme; IPv6 hosts in brackets. This is
/// what Envoy's ORIGINAL_DST cluster dials, so workers should be addressed by IP in EPP mode.
pub(crate) fn endpoint_of(worker: &Worker) -> Option<String> {
    let url = url::Url::parse(worker.url()).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(format!("{host}:{port}"))
}

/// The endpoints of a subset hint: `None` when the request carries no hint (pick from the
/// whole pool), `Some` (possibly empty) when it does. Entries that are not strings are
/// ignored, as is a hint that is not a list.
pub(crate) fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?.fields.get(SUBSET_KEY)?;
    let endpoints = match &hint.kind {
        Some(Kind::ListValue(list)) => list
            .values
            .iter()
            .filter_map(|value| match &value.kind {
                Some(Kind::StringValue(endpoint)) => Some(endpoint.trim().to_owned()),
                _ => None,
            })
            .collect(),
        // A single endpoint given as a string (or a comma-separated list) is read as one.
        Some(Kind::StringValue(endpoints)) => endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    Some(endpoints)
}

/// The workers of `registry` whose endpoint is one of `endpoints`.
pub(crate) fn workers_at(registry: &WorkerRegistry, endpoints: &[String]) -> Vec<WorkerId> {
    let by_endpoint: HashMap<String, WorkerId> = registry
        .workers()
        .iter()
        .filter_map(|worker| endpoint_of(worker).map(|e| (e, worker.id().clone())))
        .collect();
    endpoints.iter().filter_map(|endpoint| by_endpoint.get(endpoint).cloned()).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost_types::{ListValue, Struct, Value};
    use router_workers::ModelId;

    use super::*;

    fn metadata(hint: Kind) -> Metadata {
        let fields = BTreeMap::from([(SUBSET_KEY.to_owned(), Value { kind: Some(hint) })]);
        Metadata {
            filter_metadata: [(SUBSET_NAMESPACE.to_owned(), Struct { fields })].into(),
            ..Metadata::default()
        }
    }

    fn strings(items: &[&str]) -> Kind {
        let values = items
            .iter()
            .map(|s| Value { kind: Some(Kind::StringValue((*s).to_owned())) })
            .collect();
        Kind::ListValue(ListValue { values })
    }

    #[test]
    fn a_worker_is_named_by_the_authority_of_its_url() {
        let model = ModelId::new("m");
        let at = |url: &str| endpoint_of(&Worker::plain("w", url, &model).expect("worker"));
        assert_eq!(at("http://10.0.0.7:8000").as_deref(), Some("10.0.0.7:8000"));
        assert_eq!(at("http://10.0.0.7").as_deref(), Some("10.0.0.7:80"));
        assert_eq!(at("https://10.0.0.7/v1").as_deref(), Some("10.0.0.7:443"));
        assert_eq!(at("http://[fd00::1]:9000").as_deref(), Some("[fd00::1]:9000"));
    }

    #[test]
    fn the_subset_hint_is_absent_a_list_or_empty() {
        assert_eq!(subset_hint(None), None);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        let listed = metadata(strings(&["10.0.0.1:8000", " 10.0.0.2:8000 "]));
        assert_eq!(
            subset_hint(Some(&listed)),
            Some(vec!["10.0.0.1:8000".to_owned(), "10.0.0.2:8000".to_owned()])
        );
        assert_eq!(subset_hint(Some(&metadata(strings(&[])))), Some(vec![]));
        let one = metadata(Kind::StringValue("10.0.0.1:8000,10.0.0.3:8000".to_owned()));
        assert_eq!(subset_hint(Some(&one)).map(|s| s.len()), Some(2));
        assert_eq!(subset_hint(Some(&metadata(Kind::NumberValue(1.0)))), Some(vec![]));
    }

    #[test]
    fn hinted_endpoints_resolve_to_the_workers_there_and_unknown_ones_to_nothing() {
        let model = ModelId::new("m");
        let registry = WorkerRegistry::new();
        for (id, url) in [("a", "http://10.0.0.1:8000"), ("b", "http://10.0.0.2:8000")] {
            registry.add(Worker::plain(id, url, &model).expect("worker")).expect("added");
        }
        let hint = ["10.0.0.2:8000".to_owned(), "10.9.9.9:1".to_owned()];
        assert_eq!(workers_at(&registry, &hint), vec![WorkerId::new("b").expect("id")]);
        assert!(workers_at(&registry, &[]).is_empty());
    }
}

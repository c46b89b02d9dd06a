//! The Envoy gateway configuration the end-to-end tests and the endpoint-picker benchmark both
//! run: `tests/envoy/gateway.yaml` filled in, its `pool` cluster either the engines themselves
//! (round robin) or wherever the picker's `x-gateway-destination-endpoint` says, with the
//! ext_proc filter of docs/epp.md (`tests/envoy/ext_proc.yaml`) asking the picker cluster.

/// The gateway, with placeholders (see the file's header).
const GATEWAY: &str = include_str!("../../../tests/envoy/gateway.yaml");

/// The ext_proc filter, `{failure_mode_allow}` its one placeholder.
const EXT_PROC: &str = include_str!("../../../tests/envoy/ext_proc.yaml");

/// What differs between gateways: the ports (0 lets Envoy choose), lines under the route,
/// the `http_filters` entries before the router, and the clusters (`pool` among them).
#[derive(Clone, Debug, Default)]
pub struct Gateway {
    /// The admin interface's port.
    pub admin: u16,
    /// The listener's port.
    pub port: u16,
    /// Lines under the route, indented 16 spaces (or empty).
    pub route_extra: String,
    /// `http_filters` entries before the router filter.
    pub filters: String,
    /// `clusters` entries.
    pub clusters: String,
}

impl Gateway {
    /// Envoy alone: `pool` lists the engines at `engines` (`HOST:PORT`), round robin.
    pub fn static_pool(engines: &[&str]) -> Option<Self> {
        let endpoints = endpoints(engines)?;
        let clusters = format!(
            "  - name: pool
    type: STATIC
    lb_policy: ROUND_ROBIN
    connect_timeout: 2s
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:
{endpoints}"
        );
        Some(Self { clusters, ..Self::default() })
    }

    /// Envoy with the endpoint picker(s) at `pickers` (`HOST:PORT`, gRPC): the ext_proc filter
    /// (with `failure_mode_allow`), the picker cluster health checked every `health_interval`
    /// (an Envoy duration, `0.2s`) on the ext_proc service name, and `pool` going where the
    /// picker says.
    pub fn picker(
        pickers: &[&str],
        failure_mode_allow: bool,
        health_interval: &str,
    ) -> Option<Self> {
        let endpoints = endpoints(pickers)?;
        let filters = EXT_PROC.replace("{failure_mode_allow}", &failure_mode_allow.to_string());
        let clusters = format!(
            r#"  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config: {{use_http_header: true, http_header_name: x-gateway-destination-endpoint}}
  - name: picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    health_checks:
    - timeout: 1s
      interval: {health_interval}
      no_traffic_interval: {health_interval}
      unhealthy_interval: {health_interval}
      unhealthy_threshold: 1
      healthy_threshold: 1
      grpc_health_check: {{service_name: envoy.service.ext_proc.v3.ExternalProcessor}}
    load_assignment:
      cluster_name: picker
      endpoints:
      - lb_endpoints:
{endpoints}"#
        );
        Some(Self { filters, clusters, ..Self::default() })
    }

    /// The whole bootstrap configuration.
    pub fn yaml(&self) -> String {
        GATEWAY
            .replace("{admin}", &self.admin.to_string())
            .replace("{port}", &self.port.to_string())
            .replace("{route_extra}", &self.route_extra)
            .replace("{filters}", &self.filters)
            .replace("{clusters}", &self.clusters)
    }
}

/// The `lb_endpoints` entries of `addresses` (`HOST:PORT` each); `None` for one without a port.
fn endpoints(addresses: &[&str]) -> Option<String> {
    addresses
        .iter()
        .map(|address| {
            let (host, port) = address.rsplit_once(':')?;
            Some(format!(
                "        - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}\n"
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Gateway;

    #[test]
    fn every_placeholder_is_filled_and_the_clusters_name_their_endpoints() {
        let gateway = Gateway::picker(&["127.0.0.1:9002"], true, "0.2s").expect("addresses");
        let yaml = Gateway { admin: 1, port: 2, ..gateway }.yaml();
        for placeholder in [
            "{admin}",
            "{port}",
            "{route_extra}",
            "{filters}",
            "{clusters}",
            "{failure_mode_allow}",
        ] {
            assert!(!yaml.contains(placeholder), "{placeholder} left in:\n{yaml}");
        }
        assert!(yaml.contains("port_value: 9002"), "{yaml}");
        assert!(yaml.contains("failure_mode_allow: true"), "{yaml}");
        assert!(yaml.contains("interval: 0.2s"), "{yaml}");
        let pool = Gateway::static_pool(&["127.0.0.1:7001", "127.0.0.1:7002"]).expect("addresses");
        let yaml = pool.yaml();
        assert!(yaml.contains("port_value: 7001") && yaml.contains("port_value: 7002"), "{yaml}");
        assert!(Gateway::static_pool(&["no-port"]).is_none());
    }

    #[test]
    fn the_two_gateways_differ_only_in_filters_and_clusters() {
        let direct = Gateway::static_pool(&["127.0.0.1:7001"]).expect("addresses").yaml();
        let picked = Gateway::picker(&["127.0.0.1:9002"], false, "1s").expect("addresses").yaml();
        assert!(!direct.contains("ext_proc"), "{direct}");
        assert!(picked.contains("envoy.filters.http.ext_proc") && picked.contains("ORIGINAL_DST"));
        for yaml in [&direct, &picked] {
            assert!(yaml.ends_with('\n') && yaml.contains("route: {cluster: pool, timeout: 60s}"));
        }
    }
}

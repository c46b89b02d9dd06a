//! Pod objects for the fake API server, built the way the kubelet and API server fill them in,
//! and the equality-based label selectors it filters with.

use serde_json::{Map, Value, json};

/// A pod under construction: Running and Ready on 127.0.0.1 unless told otherwise.
#[derive(Clone, Debug)]
pub struct PodBuilder {
    name: String,
    uid: Option<String>,
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
    ports: Vec<Value>,
    ip: Option<String>,
    ready: bool,
    terminating: bool,
}

/// A pod named `name`: phase Running, condition Ready, IP 127.0.0.1, no labels or ports.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder {
        name: name.to_owned(),
        uid: None,
        labels: Map::new(),
        annotations: Map::new(),
        ports: Vec::new(),
        ip: Some("127.0.0.1".to_owned()),
        ready: true,
        terminating: false,
    }
}

impl PodBuilder {
    /// Sets a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.into());
        self
    }

    /// Sets an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.into());
        self
    }

    /// Adds a named TCP container port.
    pub fn port(mut self, name: &str, port: u16) -> Self {
        self.ports.push(json!({"name": name, "containerPort": port, "protocol": "TCP"}));
        self
    }

    /// Sets the pod IP; `None`: not yet assigned (a pending pod).
    pub fn ip(mut self, ip: Option<&str>) -> Self {
        self.ip = ip.map(str::to_owned);
        self
    }

    /// Sets the Ready condition.
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }

    /// Marks the pod as being deleted (`metadata.deletionTimestamp` set).
    pub fn terminating(mut self) -> Self {
        self.terminating = true;
        self
    }

    /// Sets `metadata.uid`; by default the server assigns one when the pod is created.
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_owned());
        self
    }

    /// The pod object (without namespace and resource version, which the server sets).
    pub fn build(self) -> Value {
        let mut metadata = json!({
            "name": self.name,
            "labels": self.labels,
            "annotations": self.annotations,
            "creationTimestamp": "2025-01-01T00:00:00Z",
        });
        if let Some(uid) = self.uid {
            metadata["uid"] = uid.into();
        }
        if self.terminating {
            metadata["deletionTimestamp"] = "2025-01-01T00:05:00Z".into();
            metadata["deletionGracePeriodSeconds"] = 30.into();
        }
        let ready = if self.ready { "True" } else { "False" };
        let mut status = json!({
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "hostIP": "127.0.0.1",
        });
        if let Some(ip) = self.ip {
            status["podIP"] = ip.clone().into();
            status["podIPs"] = json!([{"ip": ip}]);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [{"name": "engine", "image": "engine:test", "ports": self.ports}]},
            "status": status,
        })
    }
}

/// One requirement of a label selector as the fake understands them: `k=v`, `k==v`, `k!=v`,
/// `k`, `!k`, `k in (a,b)` and `k notin (a,b)`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equal(String, String),
    NotEqual(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector` query parameter; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses the selector; `None` for what the fake does not understand (answered 400).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut requirements = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            // A set requirement's values contain commas: take through its closing parenthesis.
            let end = match (rest.find('('), rest.find(',')) {
                (Some(open), Some(comma)) if open < comma => rest.find(')')? + 1,
                (_, Some(comma)) => comma,
                (_, None) => rest.len(),
            };
            requirements.push(Self::requirement(rest[..end].trim())?);
            rest = rest[end..].trim_start().trim_start_matches(',').trim_start();
        }
        Some(Self(requirements))
    }

    fn requirement(text: &str) -> Option<Requirement> {
        let set = |op: &str| {
            let (key, values) = text.split_once(op)?;
            let values = values.trim().strip_prefix('(')?.strip_suffix(')')?;
            Some((key.trim().to_owned(), values.split(',').map(|v| v.trim().to_owned()).collect()))
        };
        if let Some((key, values)) = set(" notin ") {
            return Some(Requirement::NotIn(key, values));
        }
        if let Some((key, values)) = set(" in ") {
            return Some(Requirement::In(key, values));
        }
        if let Some((key, value)) = text.split_once("!=") {
            return Some(Requirement::NotEqual(key.trim().into(), value.trim().into()));
        }
        if let Some((key, value)) = text.split_once("==").or_else(|| text.split_once('=')) {
            return Some(Requirement::Equal(key.trim().into(), value.trim().into()));
        }
        if let Some(key) = text.strip_prefix('!') {
            return Some(Requirement::Absent(key.trim().into()));
        }
        (!text.is_empty() && !text.contains(' ')).then(|| Requirement::Exists(text.into()))
    }

    /// Whether `object`'s labels satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |key: &str| labels.get(key).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equal(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEqual(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_as_kubernetes_defines_them() {
        let object = pod("p").label("app", "engine").label("tier", "gpu").build();
        for (selector, expected) in [
            ("", true),
            ("app=engine", true),
            ("app==engine,tier=gpu", true),
            ("app=engine, tier!=gpu", false),
            ("app in (engine, other),tier", true),
            ("app notin (engine)", false),
            ("!zone", true),
            ("zone", false),
        ] {
            let parsed = Selector::parse(selector).expect(selector);
            assert_eq!(parsed.matches(&object), expected, "{selector}");
        }
        assert_eq!(Selector::parse("app in (a"), None);
    }
}

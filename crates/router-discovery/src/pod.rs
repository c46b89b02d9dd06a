//! One pod, judged: a worker (Ready, not terminating, with an IP, and everything the worker
//! needs readable from it), a pod that is not serving yet or any more, or a pod that cannot be
//! a worker and is skipped with a warning naming it.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use router_workers::{DiscoveredPod, KvEventsSpec, ModelId, Stage, WorkerSpec};

use crate::config::{BOOTSTRAP_PORT_ANNOTATION, ModelSource, PodPort, WorkerTemplate};

/// What a pod is to the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodVerdict {
    /// A worker with this spec, serving this model.
    Serving(Box<PodWorker>),
    /// Not serving: not Ready, terminating or without an IP yet. Not a problem.
    Waiting(WaitReason),
    /// Cannot be a worker; skipped with a warning.
    Invalid(PodProblem),
}

/// The worker a serving pod stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodWorker {
    /// As a configured worker would be written (its id is the pod's name).
    pub spec: WorkerSpec,
    /// The model it serves.
    pub model: ModelId,
    /// The pod.
    pub pod: DiscoveredPod,
}

/// Why a pod is not serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// `metadata.deletionTimestamp` is set.
    Terminating,
    /// Its `Ready` condition is not `True`.
    NotReady,
    /// No `status.podIP` yet.
    NoIp,
}

impl WaitReason {
    /// A short description.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Terminating => "terminating",
            WaitReason::NotReady => "not ready",
            WaitReason::NoIp => "no pod IP",
        }
    }
}

/// Why a pod cannot be a worker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PodProblem {
    /// No `metadata.name` or `metadata.uid` (an API server always sets both).
    #[error("the pod has no name or uid")]
    Unnamed,
    /// The configured port names a container port the pod does not have.
    #[error("no container port named {name:?} ({what})")]
    NoSuchPort {
        /// The port name.
        name: String,
        /// What the port is for.
        what: &'static str,
    },
    /// `status.podIP` is not an IP address.
    #[error("pod IP {ip:?} is not an IP address")]
    BadIp {
        /// The value.
        ip: String,
    },
    /// An annotation the router reads has a value it cannot use.
    #[error("annotation {key}={value:?}: {reason}")]
    BadAnnotation {
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The model label is missing.
    #[error("no label {key} naming its model")]
    NoModelLabel {
        /// The label key.
        key: String,
    },
    /// The model label names a model the router does not serve.
    #[error("label {key}={model:?} names a model this router does not serve ({served})")]
    UnknownModel {
        /// The label key.
        key: String,
        /// The value.
        model: String,
        /// The served models, comma-separated.
        served: String,
    },
    /// More than one role's selector selects the pod.
    #[error("selected as {first} and as {second}: a pod has one role")]
    SeveralRoles {
        /// One role.
        first: Stage,
        /// Another.
        second: Stage,
    },
    /// A worker of the same id came from elsewhere (the configuration or the admin API).
    #[error("worker id {id:?} is taken by a worker from {by}")]
    IdTaken {
        /// The id.
        id: String,
        /// Where the other worker came from.
        by: &'static str,
    },
    /// The worker was refused (its spec, or the registry's rules).
    #[error(transparent)]
    Worker(#[from] router_workers::WorkerError),
}

/// Judges `pod`, selected as `stage`, in `namespace`.
pub fn judge(
    pod: &Pod,
    stage: Stage,
    namespace: &str,
    template: &WorkerTemplate,
    models: &ModelSource,
) -> PodVerdict {
    match worker_of(pod, stage, namespace, template, models) {
        Ok(worker) => PodVerdict::Serving(Box::new(worker)),
        Err(Judged::Waiting(reason)) => PodVerdict::Waiting(reason),
        Err(Judged::Invalid(problem)) => PodVerdict::Invalid(problem),
    }
}

enum Judged {
    Waiting(WaitReason),
    Invalid(PodProblem),
}

impl From<PodProblem> for Judged {
    fn from(problem: PodProblem) -> Self {
        Judged::Invalid(problem)
    }
}

fn worker_of(
    pod: &Pod,
    stage: Stage,
    namespace: &str,
    template: &WorkerTemplate,
    models: &ModelSource,
) -> Result<PodWorker, Judged> {
    let meta = &pod.metadata;
    let (Some(name), Some(uid)) = (meta.name.as_deref(), meta.uid.as_deref()) else {
        return Err(PodProblem::Unnamed.into());
    };
    if meta.deletion_timestamp.is_some() {
        return Err(Judged::Waiting(WaitReason::Terminating));
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Err(Judged::Waiting(WaitReason::NotReady));
    }
    let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()).filter(|ip| !ip.is_empty()) else {
        return Err(Judged::Waiting(WaitReason::NoIp));
    };
    let ip: IpAddr = ip.parse().map_err(|_| PodProblem::BadIp { ip: ip.to_owned() })?;
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let model = model_of(pod, models)?;
    let port = |port: &PodPort, what| resolve_port(pod, port, what);
    let scheme = if template.https { "https" } else { "http" };
    let url = format!("{scheme}://{host}:{}", port(&template.port, "the engine's HTTP port")?);
    let kv_events = match &template.kv_events {
        None => None,
        Some(kv) => {
            let replay = match &kv.replay_port {
                Some(p) => Some(format!("tcp://{host}:{}", port(p, "KV-event replay")?)),
                None => None,
            };
            Some(KvEventsSpec {
                replay_endpoint: replay,
                topic: kv.topic.clone(),
                block_size: kv.block_size,
                ..KvEventsSpec::new(format!("tcp://{host}:{}", port(&kv.port, "KV events")?))
            })
        }
    };
    let load_reporter = match &template.load_reporter_port {
        Some(p) => Some(format!("{host}:{}", port(p, "the load reporter")?)),
        None => None,
    };
    let bootstrap_port = if stage == Stage::Prefill { bootstrap_port(pod)? } else { None };
    let spec = WorkerSpec {
        model: Some(model.to_string()),
        bootstrap_port,
        dp_size: template.dp_size,
        dp_route: template.dp_route,
        block_size: template.block_size,
        kv_events,
        load_reporter,
        load_poll: template.load_poll.clone(),
        api_key: template.api_key.clone(),
        ..WorkerSpec::new(name, url, stage)
    };
    let pod = DiscoveredPod {
        namespace: meta.namespace.clone().unwrap_or_else(|| namespace.to_owned()),
        pod: name.to_owned(),
        uid: uid.to_owned(),
    };
    Ok(PodWorker { spec, model, pod })
}

fn model_of(pod: &Pod, models: &ModelSource) -> Result<ModelId, PodProblem> {
    match models {
        ModelSource::Fixed(model) => Ok(model.clone()),
        ModelSource::Label { key, served } => {
            let value = pod.metadata.labels.as_ref().and_then(|labels| labels.get(key));
            let Some(value) = value else {
                return Err(PodProblem::NoModelLabel { key: key.clone() });
            };
            served.iter().find(|m| m.as_str() == value).cloned().ok_or_else(|| {
                PodProblem::UnknownModel {
                    key: key.clone(),
                    model: value.clone(),
                    served: served.iter().map(ModelId::as_str).collect::<Vec<_>>().join(", "),
                }
            })
        }
    }
}

fn resolve_port(pod: &Pod, port: &PodPort, what: &'static str) -> Result<u16, PodProblem> {
    let name = match port {
        PodPort::Number(number) => return Ok(*number),
        PodPort::Name(name) => name,
    };
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .flat_map(|container| container.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name.as_str()))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| PodProblem::NoSuchPort { name: name.clone(), what })
}

fn bootstrap_port(pod: &Pod) -> Result<Option<u16>, PodProblem> {
    let annotations = pod.metadata.annotations.as_ref();
    let Some(value) = annotations.and_then(|a| a.get(BOOTSTRAP_PORT_ANNOTATION)) else {
        return Ok(None);
    };
    match value.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err(PodProblem::BadAnnotation {
            key: BOOTSTRAP_PORT_ANNOTATION,
            value: value.clone(),
            reason: "must be a port number from 1 to 65535",
        }),
        Ok(port) => Ok(Some(port)),
    }
}

#[cfg(test)]
mod tests;

//! The connection to the cluster: an explicit API server URL, a kubeconfig file, or what kube
//! infers (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account), and the
//! namespace to watch.

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::ClusterConfig;

/// Why the router has no client for the cluster (read locally: no request is sent yet).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The API server URL does not parse.
    #[error("discovery api_server {url:?} is not a URL")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error("no cluster credentials: no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a pod")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client cannot be built from the configuration (its TLS settings, say).
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// A client and the namespace to watch.
pub(crate) async fn connect(
    cluster: &ClusterConfig,
) -> Result<(kube::Client, String), ConnectError> {
    let url = match &cluster.api_server {
        Some(url) => Some(
            url.parse::<http::Uri>()
                .map_err(|source| ConnectError::BadUrl { url: url.clone(), source })?,
        ),
        None => None,
    };
    let mut config = match (&cluster.kubeconfig, &url) {
        (Some(path), _) => {
            let failed =
                |source| ConnectError::Kubeconfig { path: path.display().to_string(), source };
            let file = Kubeconfig::read_from(path).map_err(failed)?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(failed)?
        }
        (None, Some(url)) => kube::Config::new(url.clone()),
        (None, None) => kube::Config::infer().await.map_err(ConnectError::Infer)?,
    };
    if let Some(url) = url {
        config.cluster_url = url;
    }
    let namespace = cluster.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(ConnectError::Client)?;
    Ok((client, namespace))
}

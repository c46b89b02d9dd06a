//! The fake's wire format checked by an independent client, `kubectl`: a LIST with a label
//! selector, a WATCH that sees a pod enter and leave the selection, a BOOKMARK, a 410 Gone for
//! a compacted resource version, and 403 for a forbidden namespace.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::{FakeKube, pod};

/// A kubeconfig file for `fake`, removed on drop.
struct Kubeconfig(std::path::PathBuf);

impl Kubeconfig {
    fn write(fake: &FakeKube) -> Self {
        let path = std::env::temp_dir().join(format!(
            "fake-kube-{}-{}.yaml",
            std::process::id(),
            fake.port()
        ));
        std::fs::write(&path, fake.kubeconfig("inference")).expect("write kubeconfig");
        Self(path)
    }
}

impl Drop for Kubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `kubectl --kubeconfig K ARGS`, run to completion on a blocking thread: (status, stdout,
/// stderr).
async fn kubectl(config: &Kubeconfig, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new("kubectl");
    command.arg("--kubeconfig").arg(&config.0).args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("kubectl runs (it is installed on this kind of machine)");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn names(list: &str) -> Vec<String> {
    let list: Value = serde_json::from_str(list).unwrap_or_else(|err| panic!("{err}: {list}"));
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_lists_by_selector_and_forbidden_namespaces_are_refused() {
    let fake = FakeKube::start().await;
    let config = Kubeconfig::write(&fake);
    fake.put_pod("inference", pod("e1").label("app", "engine").build());
    fake.put_pod("inference", pod("e2").label("app", "engine").build());
    fake.put_pod("inference", pod("other").label("app", "web").build());
    fake.put_pod("elsewhere", pod("e9").label("app", "engine").build());

    let (ok, out, err) = kubectl(&config, &["get", "pods", "-l", "app=engine", "-o", "json"]).await;
    assert!(ok, "{err}");
    assert_eq!(names(&out), ["e1", "e2"], "the context's namespace, by selector");
    let (ok, out, err) = kubectl(&config, &["get", "pods", "-n", "elsewhere", "-o", "json"]).await;
    assert!(ok, "{err}");
    assert_eq!(names(&out), ["e9"]);

    fake.forbid("inference", true);
    let (ok, _, err) = kubectl(&config, &["get", "pods", "-o", "json"]).await;
    assert!(!ok, "a forbidden namespace is refused");
    assert!(err.contains("forbidden"), "{err}");
    assert!(
        fake.requests().iter().any(|r| r == "LIST inference app=engine"),
        "{:?}",
        fake.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watches_pods_enter_and_leave_the_selection_and_a_compacted_version_is_gone() {
    let fake = FakeKube::start().await;
    let config = Kubeconfig::write(&fake);
    fake.put_pod("inference", pod("e1").label("app", "engine").build());

    let mut watching = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&config.0)
        .args(["get", "pods", "-l", "app=engine", "--watch-only", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl runs");
    let stdout = watching.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // `-o json` prints each object as indented JSON; a line `}` at column 0 ends one.
        let mut object = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            object.push_str(&line);
            if line == "}" {
                let _ = tx.send(std::mem::take(&mut object));
            }
        }
    });
    let patience = router_patience();
    assert!(
        crate::poll_until(async || fake.live_watches() > 0).await,
        "kubectl never started watching"
    );
    fake.put_pod("inference", pod("e2").label("app", "engine").build());
    // Relabelled out of the selection: the watch sees it leave.
    fake.put_pod("inference", pod("e1").label("app", "retired").build());
    fake.bookmark();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let object = rx.recv_timeout(patience).expect("kubectl printed the watched change");
        let object: Value = serde_json::from_str(&object).expect("an object");
        seen.push(object["metadata"]["name"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(seen, ["e2", "e1"], "e2 entered, e1 left");
    let _ = watching.kill();
    let _ = watching.wait();

    let compacted_from = fake.requests().len();
    fake.compact();
    let (ok, out, err) = kubectl(
        &config,
        &["get", "--raw", "/api/v1/namespaces/inference/pods?watch=true&resourceVersion=1"],
    )
    .await;
    assert!(ok, "{err}");
    let event: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(fake.requests()[compacted_from..], ["WATCH inference 1".to_owned()]);
}

fn router_patience() -> Duration {
    crate::PATIENCE
}

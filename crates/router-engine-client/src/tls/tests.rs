//! The engine TLS settings: a CA bundle is read and must hold a usable certificate; an
//! unreadable file, a malformed PEM section or a bundle without a certificate is a problem
//! named at `server.engine_ca_file`.

use std::path::PathBuf;

use super::{TlsConfigError, engine_client_config};

/// A self-signed CA certificate (`CN=router-test-ca`, P-256), made for these tests.
const CA: &str = "\
-----BEGIN CERTIFICATE-----
MIIBijCCAS+gAwIBAgIUBBBd4TCLlgzT7XgvlQtycfviqacwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOcm91dGVyLXRlc3QtY2EwIBcNMjYxMjAxMTMxNzMyWhgPMjEy
NjExMDcxMzE3MzJaMBkxFzAVBgNVBAMMDnJvdXRlci10ZXN0LWNhMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAE+5z2Pcv1jwn1AUZtVkpQ511FCmotyLGAJD/+nwzF
0Y1uEY5ZhXe6rLusDhmMJ5zPpLLNutCUJoFzFFup7maqt6NTMFEwHQYDVR0OBBYE
FNGWHi56LPobeaIqRme7iNyQGvmBMB8GA1UdIwQYMBaAFNGWHi56LPobeaIqRme7
iNyQGvmBMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhALD5pL3i
Z/xt2MJPLSMKpxB0yVEAAoKpjxXExwFMf6YGAiEA4nciKQHJ+yInC171bjykzRT2
CTgHPCu2tSvSqHhI+lA=
-----END CERTIFICATE-----
";

/// This test process's scratch directory `name`.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("router-tls-{}-{name}", std::process::id()))
}

/// `text` in the file `name` of the scratch directory `dir`.
fn file(dir: &str, name: &str, text: &str) -> PathBuf {
    let dir = scratch(dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("written");
    path
}

#[test]
fn a_ca_bundle_must_hold_a_usable_certificate() {
    let junk_der = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
    let malformed = "-----BEGIN CERTIFICATE-----\n!!! not base64 !!!\n-----END CERTIFICATE-----\n";
    let two = format!("{CA}{CA}");
    let missing = std::env::temp_dir().join("router-tls-no-such-dir").join("ca.pem");
    #[rustfmt::skip]
    let cases: [(&str, PathBuf, Option<&str>); 6] = [
        ("one certificate", file("bundles", "one.pem", CA), None),
        ("two certificates", file("bundles", "two.pem", &two), None),
        ("no such file", missing, Some("cannot read ")),
        ("no PEM section at all", file("bundles", "text.pem", "just some text\n"), Some("holds no usable CA certificate")),
        ("a certificate that does not parse", file("bundles", "junk.pem", junk_der), Some("holds no usable CA certificate")),
        ("a malformed PEM section", file("bundles", "malformed.pem", malformed), Some("cannot read ")),
    ];
    for (name, path, problem) in cases {
        match (engine_client_config(Some(&path)), problem) {
            (Ok(_), None) => {}
            (Err(err), Some(says)) => {
                let message = err.to_string();
                assert!(message.contains(says), "{name}: {message}");
                assert!(
                    message.contains(&*path.to_string_lossy()),
                    "{name} names the file: {message}"
                );
                assert!(!matches!(err, TlsConfigError::Provider(_)), "{name}");
            }
            (result, _) => panic!("{name}: {result:?}"),
        }
    }
    assert!(engine_client_config(None).is_ok(), "the system roots alone");
    let _ = std::fs::remove_dir_all(scratch("bundles"));
}

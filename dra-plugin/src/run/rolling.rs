//! Rolling upgrades (`--rolling-update-uid`): sockets named per pod, as the kubelet (1.33+) and
//! the upstream helper's `RollingUpdate` expect, so the old and the new pod of the DaemonSet serve
//! side by side; and the checkpoint's writer lock they share (dra-plugin-core's
//! `checkpoint::shared`).
use std::path::Path;

use anyhow::Context;
use dra_plugin_core::checkpoint::StartupLock;

/// The DRA and registration socket file names: `dra.sock` and `<driver>-reg.sock`, or with a
/// pod UID `dra-<uid>.sock` and `<driver>-<uid>-reg.sock`, so that neither pod's start replaces
/// the other's socket (which the kubelet would take for the plugin going away).
pub(super) fn socket_names(driver: &str, uid: Option<&str>) -> (String, String) {
    match uid {
        None => ("dra.sock".into(), format!("{driver}-reg.sock")),
        Some(uid) => (
            format!("dra-{uid}.sock"),
            format!("{driver}-{uid}-reg.sock"),
        ),
    }
}

/// The pod UID when rolling updates are on (an empty value means off); refuses one that could
/// not be part of a file name.
pub(super) fn pod_uid(flag: Option<&str>) -> anyhow::Result<Option<&str>> {
    match flag.map(str::trim) {
        None | Some("") => Ok(None),
        Some(uid) if uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => Ok(Some(uid)),
        Some(uid) => anyhow::bail!(
            "--rolling-update-uid (POD_UID) {uid:?}: expected a pod UID (letters, digits, '-')"
        ),
    }
}

/// With rolling updates, waits for the checkpoint's writer lock (the other pod may be in the
/// middle of a call) before the checkpoint is loaded and recovered.
pub(super) async fn startup_lock(
    checkpoint: &Path,
    uid: Option<&str>,
) -> anyhow::Result<Option<StartupLock>> {
    let Some(uid) = uid else { return Ok(None) };
    let (path, id) = (
        checkpoint.to_path_buf(),
        format!("{uid} {}", std::process::id()),
    );
    let lock = tokio::task::spawn_blocking(move || StartupLock::acquire(&path, &id))
        .await
        .context("waiting for the checkpoint lock")??;
    Ok(Some(lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_carry_the_pod_uid_only_with_rolling_updates() {
        assert_eq!(
            socket_names("gpu.nvidia.com", None),
            ("dra.sock".into(), "gpu.nvidia.com-reg.sock".into())
        );
        assert_eq!(
            socket_names("gpu.nvidia.com", Some("4f2a-9c")),
            (
                "dra-4f2a-9c.sock".into(),
                "gpu.nvidia.com-4f2a-9c-reg.sock".into()
            )
        );
    }

    #[test]
    fn an_empty_uid_turns_rolling_updates_off_and_a_path_is_refused() {
        assert_eq!(pod_uid(None).unwrap(), None);
        assert_eq!(pod_uid(Some("")).unwrap(), None);
        assert_eq!(pod_uid(Some("ab-12")).unwrap(), Some("ab-12"));
        let e = pod_uid(Some("../x")).unwrap_err().to_string();
        assert!(e.contains("--rolling-update-uid"), "{e}");
    }
}

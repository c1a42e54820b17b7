//! The admission webhook (`dra-controller webhook`) behind the real API server: bad opaque configs
//! of `gpu.nvidia.com` in ResourceClaims and ResourceClaimTemplates are refused with the field
//! named, good ones and other drivers' pass, and with the webhook unreachable the chart's
//! `failurePolicy: Ignore` lets claims through; a renewed certificate is served without a restart.
//!
//! The test makes its own CA and serving certificate (rcgen), runs the webhook on a loopback port
//! (`E2E_CONTROLLER_BIN`, default `target/debug/dra-controller`) and registers it by URL. The
//! webhook configuration selects only the test's namespace, so other tests never meet it.
//!
//! `E2E_TEST_TARGETS="--test webhook" bash e2e/run.sh`; without `E2E_KUBECONFIG` it prints SKIP.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use e2e::controller::controller_bin;
use e2e::env::{WAIT, client_from_env, wait_until};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Client, Discovery};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const LABEL: &str = "e2e-webhook";

type Ca = CertifiedIssuer<'static, KeyPair>;

fn new_ca(name: &str) -> Result<Ca> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// Writes a fresh key and a certificate for 127.0.0.1 signed by `ca` into `dir`.
fn write_serving(ca: &Ca, dir: &Path) -> Result<()> {
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, ca)?;
    // Key first: the reloader keeps the old pair until cert and key match again.
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    Ok(())
}

/// One scenario: its namespace, certificate directory, webhook process and registration.
struct World {
    client: Client,
    test: String,
    dir: PathBuf,
    port: u16,
    hook: Option<Child>,
}

impl World {
    async fn new(test: &str) -> Result<Option<World>> {
        let Some((client, _)) = client_from_env().await? else {
            println!("SKIP {test}: E2E_KUBECONFIG is not set; run `bash e2e/run.sh`");
            return Ok(None);
        };
        let work = std::env::var_os("E2E_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = work.join(format!("webhook-{test}"));
        std::fs::create_dir_all(&dir)?;
        // A free port: bound and released, then handed to the webhook.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": test, "labels": {LABEL: test}},
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Some(World {
            client,
            test: test.to_owned(),
            dir,
            port,
            hook: None,
        }))
    }

    fn start_webhook(&mut self) -> Result<()> {
        let bin = controller_bin(&e2e::env::repo_root())?;
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("webhook.log"))?;
        let addr = format!("127.0.0.1:{}", self.port);
        let child = Command::new(&bin)
            .args(["webhook", "--webhook-addr", &addr])
            .arg("--webhook-cert-file")
            .arg(self.dir.join("tls.crt"))
            .arg("--webhook-key-file")
            .arg(self.dir.join("tls.key"))
            .env("RUST_LOG", "debug")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.hook = Some(child);
        Ok(())
    }

    async fn wait_listening(&self) -> Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        wait_until("the webhook to listen", WAIT, || async {
            Ok(tokio::net::TcpStream::connect(&addr).await.ok().map(drop))
        })
        .await
    }

    async fn stop_webhook(&mut self) -> Result<()> {
        if let Some(mut c) = self.hook.take() {
            c.kill().await?;
        }
        Ok(())
    }

    /// Registers the webhook by URL with `ca` as its trust, for this test's namespace only.
    async fn register(&self, ca: &Ca) -> Result<()> {
        let mut cfg: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": self.test},
            "webhooks": [{
                "name": "opaque-config.gpu.nvidia.com",
                "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", self.port)},
                "rules": [{
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"],
                    "scope": "Namespaced",
                }],
                "matchPolicy": "Equivalent",
                "namespaceSelector": {"matchLabels": {LABEL: self.test}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        }))?;
        cfg.webhooks.as_mut().context("webhooks")?[0]
            .client_config
            .ca_bundle = Some(ByteString(ca.pem().into_bytes()));
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .create(&PostParams::default(), &cfg)
            .await?;
        Ok(())
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.test)
    }

    /// Creates a claim (dry-run unless `keep`): Ok(()) when admitted, Err(message) when refused.
    async fn try_claim(&self, name: &str, config: Value, keep: bool) -> Result<Result<(), String>> {
        let claim: ResourceClaim = serde_json::from_value(claim_json(name, config))?;
        let pp = PostParams {
            dry_run: !keep,
            ..Default::default()
        };
        admitted(self.claims().create(&pp, &claim).await)
    }

    /// Waits until the API server calls the webhook for this namespace and it refuses a bad claim.
    async fn wait_refusing(&self) -> Result<String> {
        wait_until("the webhook to refuse a bad claim", WAIT, || async {
            Ok(self
                .try_claim("probe", gpu_config(bad_strategy()), false)
                .await?
                .err())
        })
        .await
    }

    async fn cleanup(mut self) -> Result<()> {
        self.stop_webhook().await.ok();
        let dp = DeleteParams::default();
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.test, &dp)
            .await
            .ok();
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.test, &dp)
            .await?;
        Ok(())
    }
}

/// Admitted, or the message of a refusal (422 Invalid or 400 from a webhook); other errors fail.
fn admitted<T>(result: kube::Result<T>) -> Result<Result<(), String>> {
    match result {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.message.contains("denied the request") => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

fn claim_json(name: &str, config: Value) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [config],
        }},
    })
}

fn gpu_config(parameters: Value) -> Value {
    json!({"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}})
}

fn sharing(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing})
}

fn bad_strategy() -> Value {
    sharing(json!({"strategy": "Timeslicing"}))
}

async fn scenario<F>(test: &str, body: F) -> Result<()>
where
    F: AsyncFnOnce(&mut World) -> Result<()>,
{
    let Some(mut w) = World::new(test).await? else {
        return Ok(());
    };
    let result = body(&mut w).await;
    let log = w.dir.join("webhook.log");
    let cleaned = w.cleanup().await;
    if result.is_err() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        println!("--- {} (last lines)", log.display());
        for l in text
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("{l}");
        }
    }
    result?;
    cleaned
}

#[tokio::test]
async fn w1_bad_configs_are_refused_with_the_field_named() -> Result<()> {
    scenario("w1", async |w| {
        let ca = new_ca("w1 ca")?;
        write_serving(&ca, &w.dir)?;
        w.start_webhook()?;
        w.wait_listening().await?;
        w.register(&ca).await?;
        let refused = w.wait_refusing().await?;
        println!("w1: {refused}");
        assert!(
            refused.contains("spec.devices.config[0].opaque.parameters.sharing.strategy"),
            "the strategy's path: {refused}"
        );
        assert!(
            refused.contains("unknown GPU sharing strategy"),
            "{refused}"
        );

        let unknown = sharing(json!({"strategy": "TimeSlicing", "timeslicingConfig": {}}));
        let refused = w.try_claim("unknown", gpu_config(unknown), true).await?;
        let message = refused.expect_err("an unknown field is refused");
        assert!(
            message.contains("spec.devices.config[0].opaque.parameters.sharing")
                && message.contains("timeslicingConfig"),
            "the unknown field named: {message}"
        );

        let good =
            sharing(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
        w.try_claim("good", gpu_config(good), true)
            .await?
            .map_err(anyhow::Error::msg)
            .context("a good config is admitted")?;
        w.claims()
            .get("good")
            .await
            .context("the good claim exists")?;

        let other = json!({"opaque": {"driver": "example.com", "parameters": {"strategy": 7}}});
        w.try_claim("other", other, true)
            .await?
            .map_err(anyhow::Error::msg)
            .context("another driver's config passes")?;

        let template: ResourceClaimTemplate = serde_json::from_value(json!({
            "metadata": {"name": "bad"},
            "spec": {"spec": claim_json("", gpu_config(bad_strategy()))["spec"]},
        }))?;
        let templates: Api<ResourceClaimTemplate> = Api::namespaced(w.client.clone(), &w.test);
        let message = admitted(templates.create(&PostParams::default(), &template).await)?
            .expect_err("a template with a bad config is refused");
        assert!(
            message.contains("spec.spec.devices.config[0].opaque.parameters.sharing.strategy"),
            "the template's path: {message}"
        );
        beta_claim_is_refused(w).await
    })
    .await
}

/// An older API version is converted to v1 for the webhook (`matchPolicy: Equivalent`), so the
/// same config is refused there too; skipped where the API server serves no v1beta2.
async fn beta_claim_is_refused(w: &World) -> Result<()> {
    let discovery = Discovery::new(w.client.clone()).run().await?;
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1beta2", "ResourceClaim");
    let Some((ar, _)) = discovery.resolve_gvk(&gvk) else {
        println!("w1: resource.k8s.io/v1beta2 is not served; the conversion check is skipped");
        return Ok(());
    };
    let mut obj: DynamicObject =
        serde_json::from_value(claim_json("beta", gpu_config(bad_strategy())))?;
    obj.types = Some(kube::core::TypeMeta {
        api_version: "resource.k8s.io/v1beta2".into(),
        kind: "ResourceClaim".into(),
    });
    let api: Api<DynamicObject> = Api::namespaced_with(w.client.clone(), &w.test, &ar);
    let message = admitted(api.create(&PostParams::default(), &obj).await)?
        .expect_err("a v1beta2 claim with a bad config is refused");
    assert!(message.contains("sharing.strategy"), "{message}");
    Ok(())
}

#[tokio::test]
async fn w2_unreachable_webhook_admits_and_a_renewed_cert_is_served() -> Result<()> {
    scenario("w2", async |w| {
        let ca = new_ca("w2 ca")?;
        write_serving(&ca, &w.dir)?;
        w.start_webhook()?;
        w.wait_listening().await?;
        w.register(&ca).await?;
        w.wait_refusing().await?;

        // failurePolicy Ignore: with nothing listening the claim is admitted (the plugin still
        // refuses the config when it prepares the claim).
        w.stop_webhook().await?;
        if let Err(m) = w
            .try_claim("down", gpu_config(bad_strategy()), false)
            .await?
        {
            bail!("refused with the webhook stopped: {m}");
        }

        // A certificate the API server does not trust: every call fails, so claims pass.
        let stranger = new_ca("w2 stranger")?;
        write_serving(&stranger, &w.dir)?;
        w.start_webhook()?;
        w.wait_listening().await?;
        if let Err(m) = w
            .try_claim("untrusted", gpu_config(bad_strategy()), false)
            .await?
        {
            bail!("refused through an untrusted certificate: {m}");
        }
        // The trusted pair written under the running webhook is picked up without a restart.
        write_serving(&ca, &w.dir)?;
        let refused = w.wait_refusing().await?;
        assert!(refused.contains("sharing.strategy"), "{refused}");
        Ok(())
    })
    .await
}

/// The helm binary: `E2E_HELM_BIN`, or what `deploy/helm/build-helm.sh` builds or finds cached.
async fn helm_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("E2E_HELM_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/build-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .await?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8(out.stdout)?;
    stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .context("build-helm.sh printed no path")
}

/// `helm template` into namespace `ns` with `--set` values: the documents, or helm's error.
async fn helm_template(helm: &Path, ns: &str, sets: &[&str]) -> Result<Result<Vec<Value>, String>> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/gpu-dra-driver");
    let mut cmd = Command::new(helm);
    cmd.args(["template", "gpu-dra"])
        .arg(&chart)
        .args(["--namespace", ns]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().await.context("running helm template")?;
    if !out.status.success() {
        return Ok(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(Ok(e2e::env::yaml_docs(&String::from_utf8(out.stdout)?)?))
}

fn doc<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}

#[tokio::test]
async fn w3_the_charts_webhook_objects_pass_server_validation() -> Result<()> {
    scenario("w3", async |w| {
        let helm = helm_bin().await?;
        let missing = helm_template(&helm, &w.test, &["webhook.enabled=true"]).await?;
        let err = missing.expect_err("a webhook without a certificate source is refused");
        assert!(err.contains("webhook.caBundle"), "{err}");

        let ca = new_ca("w3 ca")?;
        let bundle = serde_json::to_value(ByteString(ca.pem().into_bytes()))?;
        let bundle = format!("webhook.caBundle={}", bundle.as_str().context("base64")?);
        let docs = helm_template(&helm, &w.test, &["webhook.enabled=true", &bundle])
            .await?
            .map_err(anyhow::Error::msg)?;
        let args = &doc(&docs, "Deployment")?["spec"]["template"]["spec"]["containers"][0]["args"];
        assert!(
            args.as_array()
                .context("args")?
                .contains(&json!("--webhook")),
            "{args}"
        );
        let vwc: ValidatingWebhookConfiguration =
            serde_json::from_value(doc(&docs, "ValidatingWebhookConfiguration")?.clone())?;
        let hook = &vwc.webhooks.as_ref().context("webhooks")?[0];
        assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(
            hook.client_config.ca_bundle,
            Some(ByteString(ca.pem().into_bytes()))
        );
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(doc(&docs, "Service")?.clone())?;
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        Api::<ValidatingWebhookConfiguration>::all(w.client.clone())
            .create(&dry, &vwc)
            .await
            .context("the chart's ValidatingWebhookConfiguration, dry-run")?;
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(w.client.clone(), &w.test)
            .create(&dry, &service)
            .await
            .context("the chart's webhook Service, dry-run")?;

        let cm = helm_template(
            &helm,
            &w.test,
            &["webhook.enabled=true", "webhook.certManager.enabled=true"],
        )
        .await?
        .map_err(anyhow::Error::msg)?;
        let vwc = doc(&cm, "ValidatingWebhookConfiguration")?;
        let inject = &vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
        assert_eq!(inject, &json!(format!("{}/gpu-dra-webhook", w.test)));
        assert!(
            vwc["webhooks"][0]["clientConfig"]["caBundle"].is_null(),
            "{vwc}"
        );
        let cert = doc(&cm, "Certificate")?;
        assert_eq!(cert["spec"]["secretName"], "gpu-dra-webhook-tls");
        assert_eq!(doc(&cm, "Issuer")?["spec"]["selfSigned"], json!({}));
        Ok(())
    })
    .await
}

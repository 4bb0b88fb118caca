//! The Kubernetes manifests in `packaging/kubernetes/`, read as Kubernetes reads
//! them (YAML, through `tests/python/yaml_to_json.py`) and checked against plexus
//! itself: the ConfigMap's config passes `plexus check-config` with the
//! environment the Deployment gives it, its pin file loads, every port, probe path
//! and metrics path they name answers on a real daemon started from that config,
//! every Secret key and ConfigMap key they reference exists, and selectors match.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::{plexus_binary, venv_python, workspace_root, Daemon};
use serde_json::Value;

fn manifests() -> anyhow::Result<Vec<Value>> {
    let dir = workspace_root().join("packaging/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    let output = Command::new(venv_python())
        .arg(workspace_root().join("tests/python/yaml_to_json.py"))
        .args(&files)
        .output()?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice::<Vec<Value>>(&output.stdout)?)
}

fn find<'a>(documents: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name}"))
}

/// The `${NAME}`s a text refers to.
fn variables(text: &str) -> BTreeSet<String> {
    text.split("${")
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_string()))
        .filter(|name| !name.starts_with("file:"))
        .collect()
}

fn port_of(address: &str) -> anyhow::Result<u64> {
    Ok(address.rsplit_once(':').context("no port")?.1.parse()?)
}

#[tokio::test]
async fn the_kubernetes_manifests_name_only_what_plexus_has() -> anyhow::Result<()> {
    if !venv_python().exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return Ok(());
    }
    let documents = manifests()?;
    let kinds: BTreeSet<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
    ] {
        ensure!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
    // The kustomization lists every manifest.
    let kustomization =
        std::fs::read_to_string(workspace_root().join("packaging/kubernetes/kustomization.yaml"))?;
    for file in documents.iter().filter_map(|d| d["__file"].as_str()) {
        ensure!(
            file == "kustomization.yaml" || kustomization.contains(file),
            "{file} not in the kustomization"
        );
    }

    let config_map = find(&documents, "ConfigMap", "plexus")?;
    let config_text = config_map["data"]["config.toml"]
        .as_str()
        .context("config.toml")?;
    let lock_text = config_map["data"]["plexus.lock"]
        .as_str()
        .context("plexus.lock")?;
    let config: toml::Table = toml::from_str(config_text)?;
    let secret = find(&documents, "Secret", "plexus")?;
    let secret_keys: BTreeSet<&str> = secret["stringData"]
        .as_object()
        .context("stringData")?
        .keys()
        .map(String::as_str)
        .collect();
    let deployment = find(&documents, "Deployment", "plexus")?;
    let pod = &deployment["spec"]["template"];
    let labels = pod["metadata"]["labels"]
        .as_object()
        .context("pod labels")?;
    let container = &pod["spec"]["containers"][0];

    // The environment the config refers to is given, from the Secret or the pod.
    let mut environment = Vec::new();
    for variable in container["env"].as_array().context("env")? {
        let name = variable["name"].as_str().context("env name")?;
        let from = &variable["valueFrom"];
        let value = if let Some(key) = from["secretKeyRef"]["key"].as_str() {
            ensure!(from["secretKeyRef"]["name"] == "plexus", "{variable}");
            ensure!(secret_keys.contains(key), "the Secret has no {key}");
            secret["stringData"][key]
                .as_str()
                .context("a string")?
                .to_string()
        } else {
            ensure!(
                from["fieldRef"]["fieldPath"] == "status.podIP",
                "{variable}"
            );
            "10.0.0.7".to_string()
        };
        environment.push((name.to_string(), value));
    }
    for variable in variables(config_text) {
        ensure!(
            environment.iter().any(|(name, _)| *name == variable),
            "${{{variable}}} is not in the pod's env"
        );
    }

    // Mounted where the arguments and the config say.
    let args: Vec<&str> = container["args"]
        .as_array()
        .context("args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(args[..2] == ["serve", "--config"], "{args:?}");
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|mounts| mounts.iter().find(|m| m["name"] == "config"))
        .context("the config mount")?;
    let mount_path = mount["mountPath"].as_str().context("mountPath")?;
    let items: Vec<(&str, &str)> = pod["spec"]["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|v| v["name"] == "config"))
        .and_then(|volume| volume["configMap"]["items"].as_array())
        .context("the config volume")?
        .iter()
        .filter_map(|item| Some((item["key"].as_str()?, item["path"].as_str()?)))
        .collect();
    for (key, _) in &items {
        ensure!(
            config_map["data"].get(*key).is_some(),
            "the ConfigMap has no {key}"
        );
    }
    let mounted = |path: &str| {
        items
            .iter()
            .any(|(_, item)| format!("{mount_path}/{item}") == path)
    };
    ensure!(mounted(args[2]), "{} is not mounted", args[2]);
    let pins = config["daemon"]["pins"].as_str().context("[daemon] pins")?;
    ensure!(mounted(pins), "the pin file {pins} is not mounted");

    // The ports the config listens on are the container's named ports.
    let ports: Vec<(&str, u64)> = container["ports"]
        .as_array()
        .context("ports")?
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, p["containerPort"].as_u64()?)))
        .collect();
    let mcp_port = port_of(config["daemon"]["listen"].as_str().context("listen")?)?;
    let admin_port = port_of(
        config["daemon"]["admin_listen"]
            .as_str()
            .context("admin_listen")?,
    )?;
    ensure!(
        ports.contains(&("mcp", mcp_port)) && ports.contains(&("admin", admin_port)),
        "{ports:?}"
    );

    // Services select the pods and name their ports; the headless one is [cluster] dns.
    let dns = config["cluster"]["dns"].as_str().context("[cluster] dns")?;
    let (dns_host, dns_port) = dns.rsplit_once(':').context("dns port")?;
    for service in documents.iter().filter(|d| d["kind"] == "Service") {
        for (key, value) in service["spec"]["selector"]
            .as_object()
            .context("selector")?
        {
            ensure!(
                labels.get(key) == Some(value),
                "{} selects {key}={value}",
                service["metadata"]["name"]
            );
        }
        for port in service["spec"]["ports"].as_array().context("ports")? {
            let target = port["targetPort"].as_str().context("a named targetPort")?;
            let (_, number) = ports
                .iter()
                .find(|(name, _)| *name == target)
                .context("no such container port")?;
            ensure!(port["port"].as_u64() == Some(*number), "{port}");
        }
    }
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .context("namespace")?;
    let peers = find(
        &documents,
        "Service",
        dns_host.split('.').next().unwrap_or_default(),
    )?;
    ensure!(
        dns_host
            == format!(
                "{}.{namespace}.svc.cluster.local",
                peers["metadata"]["name"].as_str().unwrap_or_default()
            )
    );
    ensure!(
        peers["spec"]["clusterIP"] == "None",
        "the peers' Service is not headless"
    );
    ensure!(
        peers["spec"]["publishNotReadyAddresses"] == true,
        "draining peers must stay listed"
    );
    ensure!(
        dns_port.parse::<u64>()? == mcp_port,
        "dns names port {dns_port}"
    );
    let pdb = find(&documents, "PodDisruptionBudget", "plexus")?;
    for (key, value) in pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("pdb selector")?
    {
        ensure!(
            labels.get(key) == Some(value),
            "the budget selects {key}={value}"
        );
    }
    let drain = config["daemon"]["drain_timeout"]
        .as_str()
        .context("drain_timeout")?;
    let drain: u64 = drain.trim_end_matches('s').parse()?;
    ensure!(pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .is_some_and(|grace| grace > drain));

    // The ServiceMonitor scrapes a Service's named port with a token plexus knows.
    let monitor = find(&documents, "ServiceMonitor", "plexus")?;
    let wanted = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("monitor selector")?;
    let scraped = documents
        .iter()
        .filter(|d| d["kind"] == "Service")
        .find(|service| {
            wanted
                .iter()
                .all(|(k, v)| service["metadata"]["labels"].get(k) == Some(v))
        })
        .context("the ServiceMonitor selects no Service")?;
    let endpoint = &monitor["spec"]["endpoints"][0];
    ensure!(
        scraped["spec"]["ports"]
            .as_array()
            .is_some_and(|ports| ports.iter().any(|p| p["name"] == endpoint["port"])),
        "{endpoint}"
    );
    let scrape_key = endpoint["bearerTokenSecret"]["key"]
        .as_str()
        .context("bearerTokenSecret")?;
    ensure!(secret_keys.contains(scrape_key));
    let tokens = config["daemon"]["auth_tokens"]
        .as_table()
        .context("auth_tokens")?;
    ensure!(
        tokens
            .values()
            .any(|v| v.as_str() == Some(&format!("${{{scrape_key}}}"))),
        "{scrape_key} is no token"
    );

    // plexus itself takes the config, with the pod's environment.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config_text)?;
    let checked = Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .envs(environment.iter().map(|(k, v)| (k, v)))
        .output()?;
    ensure!(
        checked.status.success(),
        "check-config: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // And serves what the probes and the scraper ask for, on the ports they name:
    // started from the same text, its addresses and paths moved into a scratch dir.
    let lock = dir.path().join("plexus.lock");
    std::fs::write(&lock, lock_text)?;
    let mut runnable = String::new();
    for line in config_text.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        match key {
            "listen" | "admin_listen" | "state_dir" | "[daemon]" => continue,
            "pins" => runnable.push_str(&format!("pins = {:?}\n", lock.display().to_string())),
            "audit_log" => runnable.push_str(&format!(
                "audit_log = {:?}\n",
                dir.path().join("audit.jsonl").display().to_string()
            )),
            _ => {
                runnable.push_str(line);
                runnable.push('\n');
            }
        }
    }
    let (daemon_lines, sections) = runnable.split_once("[cluster]").context("[cluster]")?;
    let env: Vec<(&str, &str)> = environment
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let daemon = Daemon::builder()
        .admin_listen("0.0.0.0:0")
        .daemon(daemon_lines)
        .upstreams(format!("[cluster]{sections}"))
        .env(&env)
        .start()
        .await?;
    let admin = daemon.admin.replace("0.0.0.0", "127.0.0.1");
    let client = reqwest::Client::new();
    // Each probe as the kubelet sends it: its path, on its named port, with its
    // headers and no token, even on an admin listener beyond loopback.
    for kind in ["readinessProbe", "livenessProbe"] {
        let get = &container[kind]["httpGet"];
        ensure!(get["port"] == "admin", "{kind} on {}", get["port"]);
        let path = get["path"].as_str().context("probe path")?;
        let mut request = client
            .get(format!("{admin}{path}"))
            .timeout(Duration::from_secs(5));
        for header in get["httpHeaders"].as_array().into_iter().flatten() {
            request = request.header(
                header["name"].as_str().context("header name")?,
                header["value"].as_str().context("header value")?,
            );
        }
        let status = request.send().await?.status();
        // 503 is an answer (no upstream reachable here); 404 or 401 is not.
        ensure!(
            status == 200 || (kind == "readinessProbe" && status == 503),
            "{kind} {path}: {status}"
        );
    }
    let probe = |path: &str| {
        client
            .get(format!("{admin}{path}"))
            .header("host", "localhost")
            .timeout(Duration::from_secs(5))
            .send()
    };
    ensure!(
        probe("/metrics").await?.status() == 401,
        "/metrics without a token"
    );
    let token = secret["stringData"][scrape_key].as_str().context("token")?;
    let metrics = client
        .get(format!(
            "{admin}{}",
            endpoint["path"].as_str().context("path")?
        ))
        .header("host", "10.0.0.7")
        .bearer_auth(token)
        .send()
        .await?;
    ensure!(
        metrics.status() == 200,
        "the scraper's request: {}",
        metrics.status()
    );
    let log = daemon.log();
    ensure!(!log.contains("ERROR"), "{log}");
    Ok(())
}

"""compose.yaml, Dockerfile and .dockerignore, checked without a Docker engine: only what the Docker stack tier
(tests/stack/test_docker_stack.py, a real `docker compose up`) does not prove. That run shows Compose accepting the
file, the default profile starting healthy with its commands, mounts, configs and scrape targets, and a knob read
through the docker socket; these tests keep what it cannot see: every variable's default and the secrets, read-only
mounts and loopback ports of every profile, pinned upstream tags and the tools their healthchecks need (the tier
runs stand-ins), the Dockerfile and .dockerignore, the gpu profile (no GPU there), worker scaling, and Grafana's
provisioning (the tier's Grafana is a stub).

Variables are resolved the way Compose does with an empty environment (every `${VAR:-default}` takes its
default), or with the few overrides a test names, e.g. TARGET=vllm for the gpu profile.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from batchscope.simulator.responses import VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"

# Variables that may default to empty: secrets, and "unset = off" switches.
EMPTY_DEFAULTS = {"HF_TOKEN", "VLLM_API_KEY", "GRAFANA_TOKEN", "VLLM_CONTAINER"}
SECRETS = {"HF_TOKEN", "VLLM_API_KEY", "GRAFANA_TOKEN", "GRAFANA_ADMIN_PASSWORD"}
# The tool each upstream image's healthcheck runs, and where we saw it is in the image.
HEALTHCHECK_TOOLS = {
    "prom/prometheus": "wget",      # busybox base (prometheus v2.53.5 Dockerfile: quay.io/prometheus/busybox)
    "prom/alertmanager": "wget",    # busybox base (alertmanager v0.28.1 Dockerfile)
    "grafana/grafana": "curl",      # its Dockerfile: `apk add ... curl` (alpine), `apt-get install ... curl` (ubuntu)
    "vllm/vllm-openai": "python3",  # the interpreter vLLM runs on
}
OWN_IMAGE_TOOL = "python"  # in the python base image; the Dockerfile installs nothing else for healthchecks


# ----- helpers ---------------------------------------------------------------------------------------------


def variable_references(text: str) -> list[str]:
    """Every `${...}` body in text, outer ones first, nested ones too."""
    found, stack = [], []
    index = 0
    while index < len(text):
        if text.startswith("$$", index):
            index += 2
            continue
        if text.startswith("${", index):
            stack.append(index + 2)
            index += 2
            continue
        if text[index] == "}" and stack:
            start = stack.pop()
            found.append(text[start:index])
        index += 1
    return found


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` (nested defaults included) and `$$`, innermost first."""
    pattern = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^${}]*))?\}")
    while True:
        new = pattern.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
        if new == value:
            return new.replace("$$", "$")
        value = new


def resolved(env: dict[str, str] | None = None) -> dict:
    """compose.yaml as Compose sees it with these variables set (and no others)."""
    def walk(node):
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value) for value in node]
        return interpolate(node, env or {}) if isinstance(node, str) else node
    return walk(raw())


def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def strings(node) -> list[str]:
    """Every string in a loaded YAML document (keys and values; comments are never interpolated)."""
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in [str(key), *strings(value)]]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def services(env: dict[str, str] | None = None) -> dict[str, dict]:
    return resolved(env)["services"]


def own_image(service: dict) -> bool:
    return "build" in service


def command(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def flag(argv: list[str], name: str) -> str:
    for index, token in enumerate(argv):
        if token == name:
            return argv[index + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {argv}")


def bind_mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of every short-syntax volume whose source is a host path."""
    mounts = []
    for volume in service.get("volumes", []):
        assert isinstance(volume, str), f"long volume syntax not handled here: {volume}"
        source, target, *mode = volume.split(":")
        if source.startswith((".", "/", "~")):
            mounts.append((source, target, mode[0] if mode else "rw"))
    return mounts


# ----- the variables ----------------------------------------------------------------------------------------


def test_every_variable_has_a_default_and_only_secrets_default_to_empty():
    text = "\n".join(strings(raw()))
    assert not re.search(r"(?<!\$)\$[A-Za-z_]", text), "bare $VAR: write ${VAR:-default} (or $$ for a literal)"
    for body in variable_references(text):
        name, sep, default = body.partition(":-")
        assert sep, f"${{{body}}} has no default (write ${{{name}:-...}})"
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), f"${{{body}}}: not a variable name"
        if name in EMPTY_DEFAULTS:
            assert default == "", f"{name} must default to empty, not {default!r}"
        else:
            assert default, f"{name} needs a non-empty default"
    for name in SECRETS - {"GRAFANA_ADMIN_PASSWORD"}:
        assert f"${{{name}:-}}" in text, f"secret {name} is not wired"


def test_secrets_never_reach_a_command_line():
    """The exporter publishes the served container's command line; `ps` shows every command line."""
    for name, service in raw()["services"].items():
        argv = " ".join(command(service))
        for secret in SECRETS:
            assert secret not in argv, f"{name}: {secret} on the command line"


# ----- paths, ports, images ------------------------------------------------------------------------------------


def test_every_bind_mounted_host_path_exists_in_the_repo_and_is_read_only():
    seen = 0
    for name, service in services().items():
        for source, target, mode in bind_mounts(service):
            # ro, and z (SELinux's shared label) for the configs several containers read; never on the socket
            assert mode in {"ro", "ro,z"}, f"{name}: {source} is mounted {mode}"
            assert (mode == "ro") == (target == "/var/run/docker.sock"), f"{name}: {source} without :z"
            if source.startswith("~") or target == "/var/run/docker.sock":
                continue
            assert source.startswith("./"), f"{name}: host path {source} outside the repo"
            assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            seen += 1
    assert seen >= 5  # prometheus, alertmanager, two for grafana, the spec


def test_every_published_port_is_bound_to_loopback():
    for name, service in services().items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published on every interface"


def test_every_image_is_pinned_to_a_release():
    for name, service in raw()["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and "$" not in tag, f"{name}: {image} is not pinned"
        if own_image(service):
            assert image == "batchscope:local"  # built from this checkout, never pulled
            continue
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {image} is not a release tag"
    images = {service["image"].rpartition(":")[0] for service in raw()["services"].values()}
    assert "grafana/grafana-oss" not in images  # not updated after 12.4.0
    prometheus_tag = raw()["services"]["prometheus"]["image"].rpartition(":")[2]
    assert prometheus_tag.startswith("v2."), "rules are tested with promtool 2.42; 3.x changes defaults"
    # the simulator says it is the vLLM release the stack runs with --profile gpu (and its profile mirrors)
    assert raw()["services"]["vllm"]["image"] == f"vllm/vllm-openai:v{VLLM_VERSION}"


def test_dockerfile_base_is_pinned_runs_non_root_and_bakes_no_secrets():
    dockerfile = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert bases and all(re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", b) for b in bases)
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in {"root", "0"}
    assert not re.search(r"^(ENV|ARG)\s+.*(TOKEN|PASSWORD|SECRET|API_KEY)", dockerfile, re.MULTILINE)
    # the project without extras (no [test]): its runtime dependencies in a layer of their own, read from
    # pyproject's [project] dependencies, then the project itself
    assert re.search(r"pip install --no-deps \.(\s|$)", dockerfile), "install the project without extras"
    assert "['project']['dependencies']" in dockerfile and "optional-dependencies" not in dockerfile


def test_dockerignore_keeps_env_files_and_the_venv_out_of_the_build_context():
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "an allow-list: everything is excluded unless named"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert not {".env", ".venv", ".git", "out"} & allowed
    dockerfile = (ROOT / "Dockerfile").read_text()
    for copied in re.findall(r"^COPY\s+(.+?)\s+\S+$", dockerfile, re.MULTILINE):
        for path in copied.split():
            assert path in allowed, f"Dockerfile copies {path}, which .dockerignore leaves out"
            assert (ROOT / path).exists()


# ----- healthchecks and start order ----------------------------------------------------------------------------


def one_shot(name: str) -> bool:
    """A service that runs to its end, which others wait for to complete successfully."""
    services_ = raw()["services"]
    return services_[name].get("restart") == "no" and all(
        spec.get("condition") == "service_completed_successfully"
        for other in services_.values() for target, spec in other.get("depends_on", {}).items() if target == name)


def test_every_service_has_a_healthcheck_whose_tool_is_in_its_image():
    for name, service in raw()["services"].items():
        if one_shot(name):
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] == "CMD", f"{name}: no exec-form healthcheck"
        tool = test[1]
        if own_image(service):
            assert tool == OWN_IMAGE_TOOL, f"{name}: {tool} is not installed in our image"
        else:
            repository = service["image"].rpartition(":")[0]
            assert repository in HEALTHCHECK_TOOLS, f"{name}: which tool does {repository} have?"
            assert tool == HEALTHCHECK_TOOLS[repository], f"{name}: {repository} has {HEALTHCHECK_TOOLS[repository]}"
        assert "localhost" not in " ".join(test), f"{name}: busybox/musl may resolve localhost to ::1 first"


def test_depends_on_names_existing_services_with_a_condition_and_respects_profiles():
    all_services = raw()["services"]
    for name, service in all_services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: list form has no condition"
        for target, spec in depends.items():
            assert target in all_services, f"{name} depends on unknown {target}"
            assert spec.get("condition") in {"service_healthy", "service_completed_successfully"}, (name, target)
            assert "healthcheck" in all_services[target] or one_shot(target)
            own_profiles = set(service.get("profiles", []))
            target_profiles = set(all_services[target].get("profiles", []))
            if target_profiles and not target_profiles & own_profiles:
                # otherwise a plain `docker compose up` fails: the dependency is disabled by its profile
                assert spec.get("required") is False, f"{name} -> {target} must be required: false"


def test_the_load_generator_waits_for_whichever_server_it_targets():
    depends = raw()["services"]["locust-master"]["depends_on"]
    for target in ("simulator", "vllm"):
        assert depends[target]["condition"] == "service_healthy"  # the model is resolved when the run begins


# ----- the served target: simulator by default, vLLM with the gpu profile --------------------------------------


@pytest.mark.parametrize("target", ["simulator", "vllm"])
def test_exporter_and_load_generator_aim_at_the_same_compose_service(target):
    env = {} if target == "simulator" else {"TARGET": "vllm"}
    svc = services(env)
    exporter, master = command(svc["exporter"]), command(svc["locust-master"])
    docker_service = flag(exporter, "--docker-service")
    assert docker_service == target and docker_service in svc
    assert flag(exporter, "--vllm-url") == flag(master, "--host") == f"http://{target}:8000"
    served = svc[target]
    assert any(port.endswith(":8000") for port in served["ports"])
    assert ("gpu" in served.get("profiles", [])) == (target == "vllm")
    assert "profiles" not in svc["simulator"], "a bare `docker compose up` must bring up the simulator"


def test_an_external_vllm_url_overrides_the_target_for_both():
    svc = services({"VLLM_URL": "http://gpu-box:8000"})
    assert flag(command(svc["exporter"]), "--vllm-url") == flag(command(svc["locust-master"]), "--host") == (
        "http://gpu-box:8000")


def test_simulator_and_vllm_get_the_same_knobs_with_the_seed_baseline_as_default():
    svc = services()
    sim, vllm = command(svc["simulator"]), svc["vllm"]["entrypoint"] + command(svc["vllm"])
    for name, default in [("--max-num-seqs", "128"), ("--max-num-batched-tokens", "2048"),
                          ("--gpu-memory-utilization", "0.92"), ("--max-model-len", "8192")]:
        assert flag(sim, name) == flag(vllm, name) == default
    assert sim[:3] == ["batchscope", "sim", "serve"] and vllm[:2] == ["vllm", "serve"]
    assert sim[3] == vllm[2] == "meta-llama/Llama-3.1-8B-Instruct"
    changed = services({"MAX_NUM_BATCHED_TOKENS": "8192"})
    assert flag(command(changed["simulator"]), "--max-num-batched-tokens") == "8192"


def test_compose_knob_defaults_agree_with_vllms_knob_facts():
    """Every knob compose passes is one of batchscope.vllm.knobs (flag spelled as vLLM's), its default inside
    vLLM's bounds, a fixed vLLM default kept as vLLM's, and the cross-knob rule holding."""
    from batchscope.vllm import knobs as vllm_knobs

    for argv in (command(services()["simulator"]), command(services()["vllm"])):
        knobs = {vllm_knobs.BY_FLAG[word].name: float(argv[i + 1]) for i, word in enumerate(argv)
                 if vllm_knobs.flag_key(word) in vllm_knobs.BY_FLAG}
        assert set(knobs) == {"max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len"}
        for name, value in knobs.items():
            knob = vllm_knobs.BY_NAME[name]
            assert knob.above < value <= knob.at_most, name
            assert knob.default is None or value == knob.default, name
        assert vllm_knobs.cross_knob_problem(knobs) is None


def test_the_exporter_gets_grafana_credentials_from_the_environment_and_the_docker_socket_read_only():
    exporter, grafana = raw()["services"]["exporter"], raw()["services"]["grafana"]
    env = exporter["environment"]
    assert env["BATCHSCOPE_GRAFANA_PASSWORD"] == grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert env["BATCHSCOPE_GRAFANA_USER"] == grafana["environment"]["GF_SECURITY_ADMIN_USER"]
    assert env["BATCHSCOPE_GRAFANA_TOKEN"] == "${GRAFANA_TOKEN:-}"
    assert "${DOCKER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock:ro" in exporter["volumes"]


class _Container:
    """What the docker SDK's Container offers the exporter: attrs, id, logs."""

    def __init__(self, entrypoint, cmd):
        self.id = "c1"
        self.labels = {"com.docker.compose.project": "batchscope"}
        self.attrs = {"Config": {"Entrypoint": entrypoint, "Cmd": cmd},
                      "State": {"StartedAt": "2026-11-30T10:00:00.123456789Z"}}

    def logs(self, **_kwargs) -> bytes:
        return b"INFO [cli.py:94] GPU KV cache size: 476,016 tokens\n"


class _Client:
    def __init__(self, by_service: dict[str, _Container]):
        self.containers = self
        self._by_service = by_service
        self.filters = []

    def list(self, filters):
        self.filters.append(filters)
        service = filters["label"][0].removeprefix("com.docker.compose.service=")
        return [self._by_service[service]] if service in self._by_service else []


# the simulator's container is read through a real socket by the Docker stack tier; vLLM's (gpu profile) only here
@pytest.mark.parametrize("target", ["vllm"])
def test_the_exporter_reads_the_knobs_compose_sets_from_the_served_container(target):
    """At the docker SDK boundary: the container compose creates (Entrypoint + Cmd as compose.yaml writes them),
    found by the service label the exporter is given, yields the knobs; a changed knob is one diff line."""
    from batchscope.exporter.docker_source import DockerSource

    def container(env):
        svc = services({"TARGET": target, **env})
        return _Container(svc[target].get("entrypoint"), command(svc[target])), flag(
            command(svc["exporter"]), "--docker-service")

    before, service = container({})
    after, _ = container({"MAX_NUM_BATCHED_TOKENS": "8192"})
    client = _Client({target: before})
    view = DockerSource(lambda: client, service=service, project="batchscope").read()
    assert client.filters == [{"label": [f"com.docker.compose.service={target}",
                                         "com.docker.compose.project=batchscope"]}]
    assert (view.config.model, view.config.max_num_seqs, view.config.max_num_batched_tokens) == (
        "meta-llama/Llama-3.1-8B-Instruct", "128", "2048")
    assert view.kv_cache_tokens == 476016
    changed = DockerSource(lambda: _Client({target: after}), service=service, project="batchscope").read()
    assert changed.config.diff(view.config) == ["max_num_batched_tokens: 2048 → 8192"]


# ----- the load generator ------------------------------------------------------------------------------------


def test_workers_scale_and_the_master_waits_for_all_of_them():
    text = raw()["services"]
    worker, master = text["locust-worker"], text["locust-master"]
    assert "container_name" not in worker and "ports" not in worker  # --scale needs both absent
    assert worker["deploy"]["replicas"] == flag(command(master), "--expect-workers") == "${LOCUST_WORKERS:-1}"
    four = services({"LOCUST_WORKERS": "4"})
    assert four["locust-worker"]["deploy"]["replicas"] == flag(command(four["locust-master"]), "--expect-workers")
    assert worker["depends_on"]["locust-master"].get("restart") is True


def test_no_service_but_the_worker_is_meant_to_scale():
    for name, service in raw()["services"].items():
        assert "container_name" not in service, f"{name}: a fixed name breaks two stacks on one engine"


# ----- the gpu profile and the observability services ------------------------------------------------------


def test_the_gpu_profile_service_reserves_gpus_and_keeps_hf_token_out_of_the_command():
    gpu = {name: s for name, s in raw()["services"].items() if "gpu" in s.get("profiles", [])}
    assert list(gpu) == ["gpu-target-check", "vllm"]
    vllm = gpu["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert vllm["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"
    assert any(v.endswith(":/root/.cache/huggingface") and not v.startswith((".", "/")) for v in vllm["volumes"])
    assert "shm_size" in vllm or vllm.get("ipc") == "host"
    assert vllm["healthcheck"]["test"][-1].count("/health")
    period = vllm["healthcheck"]["start_period"]
    assert period.endswith("m") and int(period[:-1]) >= 10, "weights download before /health answers"


def test_grafana_home_dashboard_and_provisioning_come_from_the_repo():
    grafana = services()["grafana"]
    mounts = {target: source for source, target, _ in bind_mounts(grafana)}
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == "./grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/overview.json" and (ROOT / "grafana/dashboards/overview.json").is_file()
    env = grafana["environment"]
    assert (env["GF_AUTH_ANONYMOUS_ENABLED"], env["GF_AUTH_ANONYMOUS_ORG_ROLE"]) == ("true", "Viewer")
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "admin"  # the default; every port is loopback-only


def test_env_example_documents_every_variable_and_sets_no_secret():
    documented = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.fullmatch(r"#?\s?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            documented[match.group(1)] = (line.startswith("#"), match.group(2))
    used = {body.partition(":-")[0] for body in variable_references("\n".join(strings(raw())))}
    assert used <= set(documented), f"undocumented: {used - set(documented)}"
    assert set(documented) - used <= {"COMPOSE_PROFILES"}, f"not in compose.yaml: {set(documented) - used}"
    for name in SECRETS:
        commented, value = documented[name]
        assert commented or value == "", f"{name} has a value in .env.example"
    for name, (commented, _) in documented.items():
        assert commented or name in SECRETS, f"{name} is set in .env.example: copying it would change defaults"

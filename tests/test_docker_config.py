"""docker/: the compose file and the Dockerfiles, checked as far as a machine without a Docker
engine allows. Parses them and holds them against the repository: build files and COPY sources
exist, services name each other correctly, every environment variable set is one the code reads,
entry points run package modules with options their CLIs accept, the documented settings match
the ones used, the API healthcheck passes against the real server, and the package installed the
way the images install it (not editable) has everything the code loads at run time.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
PACKAGES = ("kernels", "tuner", "db", "api")
CLI_MODULES = {"tuner", "api"}

# Variables the official postgres image reads (its documentation, "Environment Variables").
POSTGRES_IMAGE_VARIABLES = {
    "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_INITDB_ARGS",
    "POSTGRES_INITDB_WALDIR", "POSTGRES_HOST_AUTH_METHOD", "PGDATA",
}  # fmt: skip
# Variables a Dockerfile may set for Python, pip and the shell rather than for gemmtune.
TOOL_VARIABLES = {
    "PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK", "DEBIAN_FRONTEND",
}  # fmt: skip


# --- compose's variable interpolation (${VAR}, ${VAR:-default}, ${VAR?err}, $VAR, $$) ---

_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(text: str, env: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4) or ""
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return arg if unset else value  # type: ignore[return-value]
        if op in ("?", ":?"):
            if unset:
                raise ValueError(f"${{{name}}} is required: {arg}")
            return value  # type: ignore[return-value]
        return value or ""

    return _VARIABLE.sub(one, text)


def interpolated_names(node: object) -> set[str]:
    """Every variable compose would read from the environment or docker/.env."""
    if isinstance(node, dict):
        return set().union(*(interpolated_names(v) for v in node.values()), set())
    if isinstance(node, list):
        return set().union(*(interpolated_names(v) for v in node), set())
    if isinstance(node, str):
        return {m.group(2) or m.group(5) for m in _VARIABLE.finditer(node) if not m.group(1)}
    return set()


def resolve(node: object, env: dict[str, str]) -> object:
    if isinstance(node, dict):
        return {k: resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node


def env_example() -> tuple[dict[str, str], dict[str, list[str]]]:
    """(settings, examples): `NAME=value` lines, and commented `# NAME=value` examples."""
    settings: dict[str, str] = {}
    examples: dict[str, list[str]] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if m := re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", line):
            settings[m.group(1)] = m.group(2)
        elif m := re.fullmatch(r"#\s*([A-Z_][A-Z0-9_]*)=(.*)", line):
            examples.setdefault(m.group(1), []).append(m.group(2))
    return settings, examples


def compose_raw() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose(env: dict[str, str] | None = None) -> dict:
    """The compose file with variables filled in from env (default: none set, so defaults)."""
    return resolve(compose_raw(), env or {})  # type: ignore[return-value]


# Environments the compose file is checked under: nothing set, the documented .env.example, and
# a site's own values (so that agreement between services cannot come from shared defaults).
ENVIRONMENTS = {
    "defaults": {},
    "env-example": env_example()[0],
    "custom": {"POSTGRES_USER": "alice", "POSTGRES_PASSWORD": "s3cret-pw", "POSTGRES_DB": "tuning",
               "GEMMTUNE_API_TOKEN": "t0ken", "GEMMTUNE_API_PORT": "9123", "GEMMTUNE_API_ADDRESS": "0.0.0.0",
               "GEMMTUNE_TUNER_ARGS": "--trials 5 --shape 512x512x512",
               "GEMMTUNE_STORAGE": "postgresql://optuna:pw@postgres/optuna"},
}  # fmt: skip


# --- Dockerfiles ---


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile_instructions(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (the syntax we use)."""
    instructions: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            instructions.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, f"{path.name} ends in a continuation line"
    return instructions


def exec_form(path: Path, keyword: str) -> list[str]:
    found = [i for i in dockerfile_instructions(path) if i.keyword == keyword]
    assert found, f"{path.name} has no {keyword}"
    args = found[-1].args  # the last one is the one that counts
    assert args.startswith("["), f"{path.name}: {keyword} should use the exec (JSON) form, got {args}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def copies(path: Path) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    result = []
    for ins in dockerfile_instructions(path):
        if ins.keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(ins.args) if ins.args.startswith("[") else shlex.split(ins.args)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue  # from another stage or image, not from the context
        words = [w for w in words if not w.startswith("--")]
        assert len(words) >= 2, f"{path.name}: {ins.keyword} {ins.args} needs a source and a destination"
        result.append((words[:-1], words[-1]))
    return result


def env_instructions(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for ins in dockerfile_instructions(path):
        if ins.keyword != "ENV":
            continue
        words = shlex.split(ins.args)
        if "=" not in words[0]:  # legacy form: ENV NAME value
            values[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            name, _, value = word.partition("=")
            values[name] = value
    return values


def our_services(config: dict) -> dict[str, dict]:
    """Services built from docker/'s Dockerfiles (the rest run published images)."""
    return {name: s for name, s in config["services"].items() if "build" in s}


def dockerfile_of(service: dict) -> Path:
    build = service["build"]
    context = (COMPOSE_FILE.parent / build["context"]).resolve()
    return context / build.get("dockerfile", "Dockerfile")


def tuner_workers(config: dict) -> dict[str, dict]:
    return {n: s for n, s in our_services(config).items() if dockerfile_of(s).name == "tuner.Dockerfile"}


DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def package_strings() -> set[str]:
    """Every string literal in the package's Python source (where environment names are read)."""
    strings: set[str] = set()
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.add(node.value)
    return strings


# --- the compose file ---


def test_compose_has_the_database_the_api_and_a_worker():
    services = compose()["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert dockerfile_of(services["api"]).name == "api.Dockerfile"
    assert tuner_workers(compose()), "no tuner worker service"


def test_every_service_has_an_image_or_a_build_that_exists():
    services = compose()["services"]
    for name, service in services.items():
        assert "image" in service or "build" in service, f"service {name} has neither image nor build"
        if "build" in service:
            dockerfile = dockerfile_of(service)
            assert dockerfile.parent == DOCKER and dockerfile.is_file(), f"{name}: no Dockerfile {dockerfile}"
            assert (COMPOSE_FILE.parent / service["build"]["context"]).resolve() == ROOT, (
                f"{name}: the build context must be the repository root (the Dockerfiles COPY from it)"
            )
        else:
            image = service["image"]
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag, got {image}"


def test_dependencies_exist_and_wait_for_healthchecks():
    services = compose()["services"]
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for target in depends:
            assert target in services, f"{name} depends on {target!r}, which is not a service"
            condition = depends[target].get("condition") if isinstance(depends, dict) else None
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy; it has no healthcheck"
    for name in ["api", *tuner_workers(compose())]:
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name
    for name in ("postgres", "api"):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name


@pytest.mark.parametrize("environment", ENVIRONMENTS.values(), ids=ENVIRONMENTS.keys())
def test_database_url_points_at_the_postgres_service_and_its_account(environment):
    config = compose(environment)
    services = config["services"]
    users = [n for n, s in services.items() if "GEMMTUNE_DB" in s.get("environment", {})]
    assert set(users) == {"api", *tuner_workers(config)}
    for name in users:
        url = make_url(services[name]["environment"]["GEMMTUNE_DB"])
        assert url.get_backend_name() == "postgresql", f"{name}: {url}"
        assert url.host in services, f"{name}: database host {url.host!r} is not a service"
        pg = services[url.host]
        assert pg["image"].startswith("postgres:"), f"{name}: {url.host} does not run PostgreSQL"
        assert (url.port or 5432) == 5432
        assert url.username == pg["environment"]["POSTGRES_USER"], name
        assert url.password == pg["environment"]["POSTGRES_PASSWORD"], name
        assert url.database == pg["environment"]["POSTGRES_DB"], name
    if environment.get("POSTGRES_USER"):
        assert make_url(services["api"]["environment"]["GEMMTUNE_DB"]).username == environment["POSTGRES_USER"]


def test_service_environment_is_read_by_the_code():
    config = compose()
    strings = package_strings()
    for name, service in our_services(config).items():
        unread = [v for v in service.get("environment", {}) if v not in strings]
        assert not unread, f"{name} sets {unread}, which no module of {PACKAGES} reads"
    for name, service in config["services"].items():
        if service.get("image", "").startswith("postgres:"):
            unknown = set(service.get("environment", {})) - POSTGRES_IMAGE_VARIABLES
            assert not unknown, f"{name} sets {unknown}, which the postgres image does not read"


def test_the_checks_above_notice_an_unread_variable():
    # The source scan must not accept anything: a made-up name is not found.
    assert "GEMMTUNE_NO_SUCH_SETTING" not in package_strings()
    assert {"GEMMTUNE_DB", "GEMMTUNE_STORAGE", "GEMMTUNE_CACHE", "GEMMTUNE_API_TOKEN"} <= package_strings()


def test_env_example_documents_exactly_the_variables_compose_reads():
    settings, examples = env_example()
    used = interpolated_names(compose_raw())
    assert set(settings) == used, (
        f"only in compose.yaml: {used - set(settings)}; only in .env.example: {set(settings) - used}"
    )
    assert set(examples) <= used, f"examples for unknown variables: {set(examples) - used}"


def check_one_gpu_per_worker(config: dict) -> None:
    workers = tuner_workers(config)
    seen: dict[str, str] = {}
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, f"{name}: one device reservation per worker"
        (device,) = devices
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        assert "count" not in device, f"{name}: device_ids and count exclude each other"
        (gpu,) = device["device_ids"]
        assert isinstance(gpu, str), f"{name}: device_ids entries are strings"
        assert gpu not in seen, f"{name} and {seen.get(gpu)} both reserve GPU {gpu}"
        seen[gpu] = name
        # The reserved GPU is the only one the container sees, so it is index 0 there.
        args = shlex.split(service.get("command") or "") or exec_form(dockerfile_of(service), "CMD")
        assert args[args.index("--gpu") + 1] == "0", f"{name}: {args}"


def test_one_gpu_reservation_per_worker():
    check_one_gpu_per_worker(compose())


README = ROOT / "README.md"


def readme_docker_section() -> str:
    text = README.read_text()
    start = text.index("## Running as a service (Docker)")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_readme_starts_it_with_one_command_and_its_extra_worker_fits():
    section = readme_docker_section()
    assert "docker compose -f docker/compose.yaml up -d\n" in section
    (snippet,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    # The README's second-GPU service, pasted at the end of the services as it says.
    text = COMPOSE_FILE.read_text()
    extended = yaml.safe_load(text.replace("\nvolumes:", "\n" + snippet + "\nvolumes:", 1))
    config = resolve(extended, {})
    assert set(tuner_workers(config)) == {"tuner-gpu0", "tuner-gpu1"}
    check_one_gpu_per_worker(config)  # type: ignore[arg-type]
    assert config["services"]["tuner-gpu1"]["depends_on"] == config["services"]["tuner-gpu0"]["depends_on"]


def test_the_worker_check_notices_two_workers_on_one_gpu():
    config = compose()
    config["services"]["tuner-gpu1"] = config["services"]["tuner-gpu0"]
    with pytest.raises(AssertionError, match="both reserve GPU 0"):
        check_one_gpu_per_worker(config)


def test_workers_stop_between_trials():
    for name, service in tuner_workers(compose()).items():
        assert service["stop_signal"] == "SIGINT", name  # the tuner's graceful stop
    assert ["SIGINT"] == [i.args for i in dockerfile_instructions(DOCKER / "tuner.Dockerfile") if i.keyword == "STOPSIGNAL"]


# --- the Dockerfiles ---


def test_there_is_a_dockerfile_per_image():
    assert {p.name for p in DOCKERFILES} == {"tuner.Dockerfile", "api.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_cover_the_package(dockerfile):
    copied: set[str] = set()
    for sources, _ in copies(dockerfile):
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY source {source} does not exist"
            copied.add(source.rstrip("/"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= copied, f"{dockerfile.name} does not copy {needed - copied}, which `pip install` needs"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerignore_keeps_the_copy_sources(dockerfile):
    # BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile, relative to the context root.
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert ".venv" in patterns and ".git" in patterns, "the context would carry the venv and history"
    for sources, _ in copies(dockerfile):
        for source in sources:
            for pattern in patterns:
                if pattern.startswith("!"):
                    continue
                hit = fnmatch.fnmatch(source, pattern) or source.startswith(pattern.rstrip("/") + "/")
                assert not hit, f"{ignore.name}: {pattern!r} drops the COPY source {source}"


def test_tuner_image_is_cuda_and_api_image_is_slim_python():
    (tuner_base,) = [i.args for i in dockerfile_instructions(DOCKER / "tuner.Dockerfile") if i.keyword == "FROM"]
    args = {i.args.partition("=")[0]: i.args.partition("=")[2]
            for i in dockerfile_instructions(DOCKER / "tuner.Dockerfile") if i.keyword == "ARG"}  # fmt: skip
    base = interpolate(tuner_base, args)
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu\d\d\.\d\d", base), base
    (api_base,) = [i.args for i in dockerfile_instructions(DOCKER / "api.Dockerfile") if i.keyword == "FROM"]
    assert re.fullmatch(r"python:3\.1[1-9]-slim", api_base), api_base
    installs = [i.args for i in dockerfile_instructions(DOCKER / "tuner.Dockerfile") if "pip install" in i.args]
    assert any("[gpu]" in line for line in installs), "the tuner needs the gpu extra (cuBLAS for the baseline)"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_environment_is_read_by_the_code_or_the_tools(dockerfile):
    strings = package_strings()
    unread = [n for n in env_instructions(dockerfile)
              if n not in TOOL_VARIABLES and not (n.startswith("GEMMTUNE_") and n in strings)]  # fmt: skip
    assert not unread, f"{dockerfile.name} sets {unread}, which neither gemmtune nor Python/pip reads"


@pytest.fixture(scope="module")
def help_text() -> dict[str, str]:
    texts = {}
    for module in sorted(CLI_MODULES):
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        texts[module] = done.stdout
    return texts


def command_lines(dockerfile: Path) -> list[list[str]]:
    """The argument lists the image runs with: its CMD, and each compose service's command under
    each environment and each documented example."""
    lines = [exec_form(dockerfile, "CMD")]
    _, examples = env_example()
    for environment in [*ENVIRONMENTS.values(), *({k: v} for k, vs in examples.items() for v in vs)]:
        for service in our_services(compose(environment)).values():
            if dockerfile_of(service) == dockerfile and service.get("command"):
                command = service["command"]
                lines.append(command if isinstance(command, list) else shlex.split(command))
    return lines


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_runs_a_package_module_with_options_it_accepts(dockerfile, help_text):
    entrypoint = exec_form(dockerfile, "ENTRYPOINT")
    assert entrypoint[:2] == ["python", "-m"] and len(entrypoint) == 3, entrypoint
    module = entrypoint[2]
    assert module in CLI_MODULES and importlib.util.find_spec(f"{module}.__main__"), module
    offered = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text[module]))
    for args in command_lines(dockerfile):
        for word in args:
            if word.startswith("-"):
                flag = word.partition("=")[0]
                assert flag in offered, f"{dockerfile.name}: `python -m {module}` has no option {flag} ({args})"
        if module == "tuner":  # its parser is public: check the values too
            from tuner.run.cli import parse_args

            parse_args(args)


def test_the_option_check_notices_an_unknown_option(help_text):
    offered = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text["tuner"]))
    assert "--gpu" in offered and "--no-such-option" not in offered


# --- running what the files describe ---


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_option(args: list[str], option: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def test_api_healthcheck_passes_against_the_image_command_and_fails_without_it(tmp_path):
    port = _free_port()
    # The image's own arguments, on loopback and a free port instead of 0.0.0.0:8000.
    args = _with_option(_with_option(exec_form(DOCKER / "api.Dockerfile", "CMD"), "--host", "127.0.0.1"),
                        "--port", str(port))  # fmt: skip
    test = compose()["services"]["api"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python" and ":8000/" in test[-1]
    check = [sys.executable, *test[2:-1], test[-1].replace(":8000/", f":{port}/")]
    env = {**os.environ, "GEMMTUNE_DB": f"sqlite:///{tmp_path / 'results.sqlite'}"}
    server = subprocess.Popen([sys.executable, "-m", "api", *args], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(check, capture_output=True, timeout=30).returncode != 0:
            assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the API healthcheck never passed"
            time.sleep(0.3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert subprocess.run(check, capture_output=True, timeout=30).returncode != 0, "passes with no server"


@pytest.mark.postgres
def test_postgres_healthcheck_command_against_a_real_server():
    url_text = os.environ.get("GEMMTUNE_TEST_PG_URL")
    if not url_text or not shutil.which("pg_isready"):
        pytest.skip("needs GEMMTUNE_TEST_PG_URL and pg_isready")
    url = make_url(url_text)
    kind, shell = compose()["services"]["postgres"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and "-h 127.0.0.1" in shell
    # In the container the variables come from the service's environment and the server is local.
    env = {**os.environ, "POSTGRES_USER": url.username or "", "POSTGRES_DB": url.database or ""}

    def check(port: int) -> int:
        command = shell.replace("-h 127.0.0.1", f"-h {url.host or '127.0.0.1'} -p {port}")
        return subprocess.run(["sh", "-c", command], env=env, capture_output=True, timeout=30).returncode

    assert check(url.port or 5432) == 0
    assert check(_free_port()) != 0


@pytest.fixture(scope="module")
def installed_like_the_image(tmp_path_factory) -> Path:
    """The package laid out as tuner.Dockerfile's COPY lines lay it out, then `pip install`ed
    (not editable) into a folder of its own; dependencies come from the test venv."""
    base = tmp_path_factory.mktemp("image")
    copy_lists = {tuple(map(tuple, (s for s, _ in copies(p)))) for p in DOCKERFILES}
    assert len(copy_lists) == 1, "the two Dockerfiles copy different things; check each"
    src = base / "src"
    for sources, destination in copies(DOCKER / "tuner.Dockerfile"):
        target = src / Path(destination).relative_to("/src")
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
    site = base / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
                           str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def run_installed(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "GEMMTUNE_CACHE": str(cwd / "cubins")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_installed_package_has_what_the_code_loads_at_run_time(installed_like_the_image, tmp_path):
    program = f"""
import pathlib, sys
site = pathlib.Path({str(installed_like_the_image)!r})
import api, db, kernels, tuner
for module in (api, db, kernels, tuner):
    assert site in pathlib.Path(module.__file__).parents, module.__file__  # not the source tree
for family in kernels.FAMILIES.values():
    family.source_hash  # reads the .cu file and the headers it includes
database = db.open_database("sqlite:///{tmp_path / 'results.sqlite'}")  # runs the migrations
from fastapi.testclient import TestClient
from api.app import create_app
client = TestClient(create_app(database))
for path in ("/", "/api/gpus", "/docs"):
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code, response.text[:500])
print("ok")
"""
    done = run_installed(installed_like_the_image, ["-c", program], tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_installed_tuner_compiles_a_kernel(installed_like_the_image, tmp_path):
    # NVRTC from its wheel and the family sources from the installed package; no GPU needed.
    done = run_installed(installed_like_the_image,
                         ["-m", "tuner", "--dry-run", "--kernel", "naive", "--dry-run-configs", "1"], tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "naive" in done.stdout and "registers" in done.stdout, done.stdout


def test_workers_take_queued_jobs_unless_told_to_tune_once():
    for name, service in tuner_workers(compose()).items():
        assert shlex.split(service["command"])[:3] == ["--worker", "--gpu", "0"], name
    one_shot = tuner_workers(compose({"GEMMTUNE_TUNER_MODE": ""}))
    for name, service in one_shot.items():
        assert shlex.split(service["command"]) == ["--gpu", "0"], name

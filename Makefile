# Headwater: `make run` starts a single local node, `make test` runs lint and the suite
# (`make test-slow` the slow part of it).
# Both create .venv and install the project into it first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_DIR := proto/headwater/v1
PYTEST_ARGS ?=

.PHONY: run test test-slow test-unit test-demo test-security lint proto bench typecheck-tree clean demo chaos chaos-short fuzz sim up down images test-deploy

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[server,spark,dev]'
	@# pyspark finds data sources by walking sys.path for pyspark_* modules, which an
	@# editable install's import hook hides: put the discovery module's folder on the path.
	$(BIN)/python -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'headwater-spark-discovery.pth').write_text(str(pathlib.Path('sparkconnector/discovery').resolve()) + '\n')"
	touch $(STAMP)

# A single node on its defaults (gRPC on 127.0.0.1:7700, data in ./data) with Kafka's
# protocol on KAFKA_LISTEN; LISTEN and DATA_DIR choose others
# (make run LISTEN=127.0.0.1:7800 KAFKA_LISTEN=127.0.0.1:9192 DATA_DIR=/tmp/hw).
KAFKA_LISTEN ?= 127.0.0.1:9092
LISTEN ?=
DATA_DIR ?=
run: $(STAMP)
	$(BIN)/headwater serve --kafka-listen $(KAFKA_LISTEN) $(if $(LISTEN),--listen $(LISTEN)) $(if $(DATA_DIR),--data-dir $(DATA_DIR))

# `make test`: lint and every test but those marked slow (the real-process fault scenarios
# the simulated cluster also runs, Spark, the short chaos run), in about 5 minutes.
# `make test-slow` runs the slow ones; CI (.ci/run) runs both.
test: $(STAMP) lint
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/pytest -m "slow and not demo" $(PYTEST_ARGS)

# Each test module's kind (tests/kinds.py): in-process only, the simulated cluster, or real
# processes. `make test-unit` runs the first, in well under a minute.
test-unit: $(STAMP)
	$(BIN)/pytest -m "unit and not slow" $(PYTEST_ARGS)

# `make demo` end to end (3 nodes, the order generator, the Spark job, Ctrl-C): about two
# minutes, so CI leaves it out; the Spark connector's own tests run in test-slow.
test-demo: $(STAMP)
	$(BIN)/pytest -m demo $(PYTEST_ARGS)

# The security suite on its own (CI runs it within `make test` and `make test-slow`):
# attacks on logins, the Raft and inter-broker ports, ACLs on every RPC and through
# forwarding, streams after revocation, each with the node's responsiveness measured.
SECURITY_TESTS := tests/test_security_attacks.py tests/test_security_cluster.py \
	tests/test_sasl_sessions.py tests/test_scram.py \
	tests/test_hardening.py tests/test_authorization.py tests/test_acls.py \
	tests/test_hostile_requests.py tests/test_tls.py tests/test_quotas.py \
	tests/test_kafka_security.py
test-security: $(STAMP)
	$(BIN)/pytest $(SECURITY_TESTS) $(PYTEST_ARGS)

# mypy resolves headwater.* through a tree of links that mirrors the package-dir
# mapping in pyproject.toml (the runtime uses setuptools' editable finder instead).
typecheck-tree:
	@rm -rf .build/typecheck && mkdir -p .build/typecheck/headwater
	@for f in headwater/*.py headwater/py.typed; do ln -s ../../../$$f .build/typecheck/headwater/; done
	@for d in shared cli tools; do ln -s ../../../headwater/$$d .build/typecheck/headwater/$$d; done
	@for d in log node raft client sparkconnector; do ln -s ../../../$$d .build/typecheck/headwater/$$d; done
	@ln -s ../../../$(PROTO_DIR) .build/typecheck/headwater/v1

lint: $(STAMP) typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p headwater

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

# A 3-node cluster, an order generator and a Spark Structured Streaming job (Ctrl-C stops).
# make demo DEMO_BASE_PORT=7800 DEMO_DATA_DIR=/some/folder: fixed ports, data kept there.
DEMO_BASE_PORT ?= 0
DEMO_DATA_DIR ?=
demo: $(STAMP)
	$(BIN)/python -m headwater.sparkconnector.demo --base-port $(DEMO_BASE_PORT) $(if $(DEMO_DATA_DIR),--data-dir "$(DEMO_DATA_DIR)")

# Fault injection (docs/chaos.md): 3 real nodes, kills, pauses, restarts and network
# partitions (in network namespaces when run as root), a Jepsen-style checker, and a
# byte-for-byte replica comparison. CHAOS_ARGS adds options, e.g. CHAOS_ARGS="--seed 42".
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(BIN)/python -m headwater.tools.chaos --cycles 200 $(CHAOS_ARGS)

chaos-short: $(STAMP)
	$(BIN)/python -m headwater.tools.chaos --cycles 16 --time-limit 180 $(CHAOS_ARGS)

# The same faults with Kafka clients: librdkafka idempotent producers and a consumer group
# through the nodes' Kafka listeners (docs/chaos.md, "Kafka clients").
.PHONY: chaos-kafka
chaos-kafka: $(STAMP)
	$(BIN)/python -m headwater.tools.chaos --client kafka --cycles 50 $(CHAOS_ARGS)

# CPU per record of storing a Kafka batch transcoded or as it comes (BENCHMARKS.md).
.PHONY: bench-kafka-storage
bench-kafka-storage: $(STAMP)
	$(BIN)/python -m tests.bench_kafka_storage $(BENCH_ARGS)

# The batch decoder's mutation fuzzer (tests/fuzz_batch.py), the client services' sweep
# and request fuzzer against a node (tests/rpc_sweep.py) and the Kafka front's request and
# batch fuzzer (tests/fuzz_kafka.py) for a long run; the tests run a fixed 30,000, 1,000
# and 4,500 cases. FUZZ_ARGS adds options to each, e.g. FUZZ_ARGS="--seed 42".
FUZZ_ARGS ?=
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz_batch --cases 1000000 $(FUZZ_ARGS)
	$(BIN)/python -m tests.rpc_sweep --cases 100000 $(FUZZ_ARGS)
	$(BIN)/python -m tests.fuzz_kafka --cases 500000 $(FUZZ_ARGS)

# The simulated cluster (tests/sim_cluster.py: brokers, controller and client in one
# process on a virtual clock, seeded faults) for a long search; the tests run 8 seeds of
# 3,000 steps. SIM_ARGS adds options, e.g. SIM_ARGS="--seed 42".
SIM_ARGS ?=
sim: $(STAMP)
	$(BIN)/python -m tests.sim_cluster --seeds 200 --steps 20000 $(SIM_ARGS)

bench: $(STAMP)
	$(BIN)/python scripts/bench_all.py

clean:
	rm -rf .build .venv .pytest_cache .mypy_cache .ruff_cache data

# The docker-compose deployment (deploy/, README "Deploy with docker-compose"): `make up`
# builds the images that are missing (Debian base by debootstrap, no registry needed),
# starts 3 nodes and Prometheus, and waits until the nodes are healthy (NODES=5 for five).
# `make down` stops them; `make down VOLUMES=1` also deletes their data.
NODES ?= 3
VOLUMES ?=
NETWORK ?= bridge
TLS ?=
COMPOSE := $(shell command -v docker-compose >/dev/null 2>&1 && echo docker-compose || echo docker compose)
COMPOSE_FILES := $(if $(filter host,$(NETWORK)),-f deploy/docker-compose.host.yml,-f deploy/docker-compose.yml -f deploy/docker-compose.5nodes.yml)

images:
	deploy/build-images.sh

up: $(STAMP)
	NODES=$(NODES) NETWORK=$(NETWORK) TLS=$(TLS) deploy/up.sh

# The deployment's test on its own (CI runs it in `make test-slow`): make up, a killed
# leader's container, a node cut off from the compose network, Prometheus, make down.
test-deploy: $(STAMP)
	$(BIN)/pytest -m slow tests/test_deploy.py $(PYTEST_ARGS)

down:
	$(COMPOSE) $(COMPOSE_FILES) down --remove-orphans $(if $(VOLUMES),--volumes)

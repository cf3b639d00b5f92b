# Targets describe themselves: `make help`.
GO        ?= go
PKGS      ?= ./...
# The published nested modules (go.work puts them in one workspace with the
# root; docs/releasing.md). The test-only modules have targets of their own:
# internal/modcheck (make test-modules) builds a user's module against all of
# them through a file proxy; internal/containers (make test-containers), the
# tests' Docker fallback, is outside the workspace so that nothing else ever
# downloads Docker's client.
NESTED    ?= prom otel
# The nested modules' packages, for one go test over the whole workspace
# (their tests then overlap the root package's instead of following them).
NESTED_PKGS = $(foreach m,$(NESTED),./$(m)/...)
BENCHTIME ?= 1s

.DEFAULT_GOAL := help
.PHONY: help deps fmt test test-unit test-integration test-modules test-containers test-faults model sim sim-mutants bench fuzz lint tidy demo sidebyside
SEEDS     ?= 2000

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## install what every target needs when missing (apt-get): servers, tmux, promtool, iproute2, spin, gcc
	@scripts/install-deps.sh all

demo: ## kill a worker mid-block and watch its rows come back (DEMO_FLAGS="-workers 4 -rows 200"); installs redis-server and PostgreSQL if missing
	@scripts/install-deps.sh demo
	$(GO) run ./examples/crashdemo $(DEMO_FLAGS)

# go test vets every package it builds; -vet=all runs go vet's full set
# there, so the packages are not type-checked a second time by make lint.
# scripts/test.sh runs internal/modcheck's -short check (a module of its
# own) beside the main go test, and the root package, whose tests mostly
# wait on TTLs and on servers of their own, as two shards at once from one
# race-built test binary: the sequential tests of scripts/root-shard1.txt,
# and every other test (its sequential ones first, then the parallel ones
# eight at a time, -parallel 8); the tests that bound a latency most
# tightly stay sequential in the second shard.
test: fmt ## the test command: gofmt, vet and unit and integration tests with -race (library, prom, otel, examples, tools); installs redis-server, PostgreSQL, tmux, promtool if missing
	@scripts/install-deps.sh test
	@GO='$(GO)' PKGS='$(PKGS)' NESTED_PKGS='$(NESTED_PKGS)' scripts/test.sh

# internal/sidebyside is a module of its own, outside go.work like
# internal/containers, so that asynq and River never reach the library's
# go.mod and make test never builds them.
SBS_FLAGS ?=
sidebyside: ## kill -9 -> picked up, recovery at its defaults beside asynq and River at theirs and tuned, one run against a throwaway redis-server and PostgreSQL at DATABASE_URL (default 127.0.0.1:5432 db test) (~26 min with SBS_FLAGS="-other-kills 10", the default 5: ~13 min); writes sidebyside-results.md; not part of make test
	@scripts/install-deps.sh demo
	cd internal/sidebyside && GOWORK=off $(GO) run . -out $(CURDIR)/sidebyside-results.md $(SBS_FLAGS)

test-modules: ## a module outside the repository resolves, builds and runs against every module through a file proxy (docs/releasing.md); ~2 min cold
	cd internal/modcheck && $(GO) test -race -vet=all -count=1 ./...

test-containers: ## vet the Docker fallback module (internal/containers; downloads Docker's client) and ask it for a container
	cd internal/containers && GOWORK=off $(GO) vet ./...
	$(GO) vet -tags containers ./internal/testutil/
	$(GO) test -race -tags containers -count=1 -run 'TestContainerHelperAnswersOverItsPipe' ./internal/testutil/

test-unit: ## fast unit tests only (miniredis; no servers needed)
	$(GO) test -race -short -count=1 $(PKGS)
	for m in $(NESTED) internal/modcheck; do (cd $$m && $(GO) test -race -short -count=1 ./...) || exit 1; done

test-integration: ## integration tests only, failing (not skipping) without servers
	@scripts/install-deps.sh test
	RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Integration|Pgx|Resetter|SQL|Schema|Safety|Stress|Scrape' $(PKGS)
	cd prom && RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Scrape|AlertRules|WithoutInstanceID' ./...
	cd otel && RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'RealRecovery|WithoutInstanceID' ./...

test-faults: ## fault-injection suite (docs/reliability.md): real worker processes killed, stopped, cut off; Sentinel failover, AOF, network namespaces; ~8 min
	@scripts/install-deps.sh faults
	$(GO) vet -tags faults ./internal/faults/
	$(GO) test -tags faults -count=1 -v -timeout 15m ./internal/faults/

model: ## model-check the recovery protocol with Spin (docs/model.md): fixes, per-life owner values and the witness pass, holes and broken variants fail; ~1 min
	@scripts/install-deps.sh model
	scripts/model.sh

sim: ## deterministic simulation of the real Worker under faults (SEEDS=2000; replay one: SEED=n)
	$(GO) vet -tags sim .
	@if [ -n "$(SEED)" ]; then $(GO) test -tags sim -count=1 -run 'TestSimulation$$' -seed $(SEED) -v .; \
	else $(GO) test -tags sim -count=1 -timeout 30m -run 'TestSimulation' -seeds $(SEEDS) . && \
	$(GO) test -race -tags sim -count=1 -run 'TestSimulation$$' -seeds 50 .; fi

sim-mutants: ## the simulation catches each reverted fix and mutation within the CI seed budget (SEEDS=2000)
	$(GO) vet -tags simmutants .
	$(GO) test -tags simmutants -count=1 -timeout 60m -run 'TestSimulationCatchesMutants' -seeds $(SEEDS) -v .

bench: ## benchmarks, benchstat-friendly (BENCHTIME=1s)
	@scripts/install-deps.sh test
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 6 $(PKGS)

fuzz: ## run each fuzz target for a few seconds (FUZZTIME=5s)
	$(GO) test -run '^$$' -fuzz FuzzValidNamesKeepEveryKeyInTheNamesSlot -fuzztime $${FUZZTIME:-5s} ./internal/store/
	$(GO) test -run '^$$' -fuzz FuzzSanitize -fuzztime $${FUZZTIME:-5s} ./internal/store/
	$(GO) test -run '^$$' -fuzz FuzzNewAcceptsExactlyTheDocumentedConfigurations -fuzztime $${FUZZTIME:-5s} .

fmt: ## fail if a file needs gofmt
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: fmt ## gofmt, go vet and doccheck (every test and Go identifier the docs cite exists), without running tests (make test runs both too); internal/containers: make test-containers
	$(GO) vet $(PKGS)
	$(GO) run ./internal/doccheck
	for m in $(NESTED) internal/modcheck; do (cd $$m && $(GO) vet ./...) || exit 1; done

tidy: ## go mod tidy in every module, the nested ones through a file proxy of the working tree
	scripts/tidy.sh

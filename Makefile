# Targets describe themselves: `make help`.
GO        ?= go
PKGS      ?= ./...
# The nested modules (go.work puts them in one workspace with the root;
# docs/releasing.md): prom and otel are published, internal/modcheck is the test that
# builds a user's module against all of them through a file proxy, and
# internal/containers the tests' Docker fallback (vetted only).
NESTED    ?= prom otel internal/modcheck
BENCHTIME ?= 1s

.DEFAULT_GOAL := help
.PHONY: help deps test test-unit test-integration test-faults model sim sim-mutants bench fuzz lint tidy demo
SEEDS     ?= 2000

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## install redis-server, PostgreSQL binaries, promtool and spin when missing (apt-get)
	@scripts/install-deps.sh

demo: deps ## kill a worker mid-block and watch its rows come back (DEMO_FLAGS="-workers 4 -rows 200")
	$(GO) run ./examples/crashdemo $(DEMO_FLAGS)

test: deps lint ## everything CI runs: vet, gofmt, unit and integration tests with -race (every module)
	$(GO) test -race -count=1 $(PKGS)
	for m in $(NESTED); do (cd $$m && $(GO) test -race -count=1 ./...) || exit 1; done

test-unit: ## fast unit tests only (miniredis; no servers needed)
	$(GO) test -race -short -count=1 $(PKGS)
	for m in $(NESTED); do (cd $$m && $(GO) test -race -short -count=1 ./...) || exit 1; done

test-integration: deps ## integration tests only, failing (not skipping) without servers
	RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Integration|Pgx|Resetter|SQL|Schema|Safety|Stress|Scrape' $(PKGS)
	cd prom && RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Scrape|AlertRules|WithoutInstanceID' ./...
	cd otel && RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'RealRecovery|WithoutInstanceID' ./...

test-faults: deps ## fault-injection suite (docs/reliability.md): real worker processes killed, stopped, cut off; Sentinel failover, AOF, network namespaces; ~8 min
	$(GO) vet -tags faults ./internal/faults/
	$(GO) test -tags faults -count=1 -v -timeout 15m ./internal/faults/

model: deps ## model-check the recovery protocol with Spin (docs/model.md): fixes pass, holes and broken variants fail; ~1 min
	scripts/model.sh

sim: ## deterministic simulation of the real Worker under faults (SEEDS=2000; replay one: SEED=n)
	$(GO) vet -tags sim .
	@if [ -n "$(SEED)" ]; then $(GO) test -tags sim -count=1 -run 'TestSimulation$$' -seed $(SEED) -v .; \
	else $(GO) test -tags sim -count=1 -timeout 30m -run 'TestSimulation' -seeds $(SEEDS) . && \
	$(GO) test -race -tags sim -count=1 -run 'TestSimulation$$' -seeds 50 .; fi

sim-mutants: ## the simulation catches each reverted fix and mutation within the CI seed budget (SEEDS=2000)
	$(GO) vet -tags simmutants .
	$(GO) test -tags simmutants -count=1 -timeout 60m -run 'TestSimulationCatchesMutants' -seeds $(SEEDS) -v .

bench: deps ## benchmarks, benchstat-friendly (BENCHTIME=1s)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 6 $(PKGS)

fuzz: ## run each fuzz target for a few seconds (FUZZTIME=5s)
	$(GO) test -run '^$$' -fuzz FuzzValidNamesKeepEveryKeyInTheNamesSlot -fuzztime $${FUZZTIME:-5s} ./internal/store/
	$(GO) test -run '^$$' -fuzz FuzzSanitize -fuzztime $${FUZZTIME:-5s} ./internal/store/
	$(GO) test -run '^$$' -fuzz FuzzNewAcceptsExactlyTheDocumentedConfigurations -fuzztime $${FUZZTIME:-5s} .

lint: ## gofmt and go vet
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	for m in $(NESTED) internal/containers; do (cd $$m && $(GO) vet ./...) || exit 1; done

tidy: ## go mod tidy in every module, the nested ones through a file proxy of the working tree
	scripts/tidy.sh

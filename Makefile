# Targets describe themselves: `make help`.
GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 1s

.DEFAULT_GOAL := help
.PHONY: help deps test test-unit test-integration test-faults model bench fuzz lint demo

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## install redis-server, PostgreSQL binaries, promtool and spin when missing (apt-get)
	@scripts/install-deps.sh

demo: deps ## kill a worker mid-block and watch its rows come back (DEMO_FLAGS="-workers 4 -rows 200")
	$(GO) run ./examples/crashdemo $(DEMO_FLAGS)

test: deps lint ## everything CI runs: vet, gofmt, unit and integration tests with -race (both modules)
	$(GO) test -race -count=1 $(PKGS)
	cd prom && $(GO) test -race -count=1 ./...

test-unit: ## fast unit tests only (miniredis; no servers needed)
	$(GO) test -race -short -count=1 $(PKGS)
	cd prom && $(GO) test -race -short -count=1 ./...

test-integration: deps ## integration tests only, failing (not skipping) without servers
	RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Integration|Pgx|Safety|Stress|Scrape' $(PKGS)
	cd prom && RECOVERY_REQUIRE_INTEGRATION=1 $(GO) test -race -count=1 -run 'Scrape|AlertRules|WithoutInstanceID' ./...

test-faults: deps ## fault-injection suite (docs/reliability.md): real worker processes killed, stopped, cut off; ~5 min
	$(GO) vet -tags faults ./internal/faults/
	$(GO) test -tags faults -count=1 -v -timeout 15m ./internal/faults/

model: deps ## model-check the recovery protocol with Spin (docs/model.md): fixes pass, holes and broken variants fail; ~1 min
	scripts/model.sh

bench: deps ## benchmarks, benchstat-friendly (BENCHTIME=1s)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 6 $(PKGS)

fuzz: ## run each fuzz target for a few seconds (FUZZTIME=5s)
	$(GO) test -run '^$$' -fuzz FuzzValidNamesKeepEveryKeyInTheNamesSlot -fuzztime $${FUZZTIME:-5s} ./internal/keys/
	$(GO) test -run '^$$' -fuzz FuzzSanitize -fuzztime $${FUZZTIME:-5s} ./internal/keys/
	$(GO) test -run '^$$' -fuzz FuzzNewAcceptsExactlyTheDocumentedConfigurations -fuzztime $${FUZZTIME:-5s} .

lint: ## gofmt and go vet
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd prom && $(GO) vet ./...

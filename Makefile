# mantle: `make run` starts the whole mesh locally; `make test` is what CI runs.

GO      ?= go
BIN     := $(CURDIR)/bin
BUF     := $(BIN)/buf
TOOLS   := $(BUF) $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-go-vtproto
GOLANGCI_LINT := $(BIN)/golangci-lint
export PATH := $(BIN):$(PATH)

.PHONY: fuzz run build test docs check-docs deps-chromium status-screenshot vet test-race generate check-generated lint breaking tools clean bench test-sdk up down drill bench-load

## run: start `mantle dev` (all services, embedded NATS, simulated models)
run:
	$(GO) run ./cmd/mantle dev

## build: build the mantle binary into bin/
build:
	$(GO) build -o $(BIN)/mantle ./cmd/mantle

## test: vet, the configuration reference check, the race-enabled test suite, and the
## generated-code check (CI runs this)
test: deps-chromium vet check-docs test-race check-generated

## docs: write docs/configuration.md from the configuration structs: keys, types and defaults
## from mesh.Default(), descriptions from the fields' doc comments (cmd/docgen)
docs:
	$(GO) run ./cmd/docgen -out docs/configuration.md

## check-docs: fail when docs/configuration.md is not what make docs writes, or a
## configuration field has no doc comment
check-docs:
	@tmp=$$(mktemp) && trap 'rm -f "$$tmp"' EXIT && \
	$(GO) run ./cmd/docgen -out "$$tmp" && \
	if ! diff -u docs/configuration.md "$$tmp"; then \
		echo "docs/configuration.md is stale: run make docs and commit it"; exit 1; fi && \
	echo "docs/configuration.md is current"

## deps-chromium: make sure the status page's browser test has a Chromium ($CHROME_BIN or
## chromium/chromium-browser/google-chrome on PATH). As root with apt-get it installs Debian's
## chromium; otherwise it says how, and the browser test skips (it fails when CI=true).
deps-chromium:
	@if [ -n "$$CHROME_BIN" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| command -v google-chrome >/dev/null 2>&1 || command -v google-chrome-stable >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the status page test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "no Chromium found: the status page browser test will skip (it fails under CI=true)."; \
		echo "  install it (Debian: sudo apt-get install chromium) or set CHROME_BIN to a Chrome/Chromium binary"; fi

vet:
	$(GO) vet ./...

# The race detector slows the largest packages (the cache's recall tests, the mesh) several
# times over on a loaded two-core machine: their binaries get 30 minutes, not go test's 10.
test-race:
	$(GO) test -race -count=1 -timeout 30m ./...
	cd tools && $(GO) test -race -count=1 ./tracewaits/

# The plain test run already replays every fuzz target's seeds and committed corpus
# (testdata/fuzz); fuzz explores beyond them.
FUZZTIME    ?= 10s
FUZZWORKERS ?= 1

## fuzz: run every fuzz target for FUZZTIME each (CI runs FUZZTIME=2s; for a real search
## FUZZTIME=10m); a crash's input lands in the package's testdata/fuzz/ to be committed
fuzz:
	GO=$(GO) tools/fuzz.sh $(FUZZTIME) $(FUZZWORKERS)

## test-sdk: run the official OpenAI Node SDK and Anthropic TypeScript SDK against an in-process mesh
## (needs Node.js and npm; CI runs it after make test)
test-sdk:
	cd test/sdk && npm ci --no-audit --no-fund
	$(GO) test -tags sdk -count=1 -v ./test/sdk/

## drill: the seed incident at a CI-friendly scale, mantle against a naive client (reports in drill-report/)
drill:
	$(GO) run ./cmd/mantle drill --scenario seed-incident --time-scale 0.025 --out drill-report

## bench-load: added latency, CPU and RSS at 500-4000 requests/s (about 4 min); see docs/performance.md
bench-load: build
	$(BIN)/mantle bench-load --rates 500,1000,2000,4000 --duration 10s --warmup 2s

## status-screenshot: regenerate docs/img/status.png from a seed-incident drill (about 3 min; needs chromium)
status-screenshot: deps-chromium
	tools/status-screenshot.sh docs/img/status.png

## bench: run the benchmarks once (compare runs with benchstat)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The tool chain (buf, the protoc plugins, golangci-lint) is pinned in tools/go.mod, a module
# of its own, so that none of it enters the product's dependency graph.
# golangci-lint has a rule of its own so that generating code never waits for its build.
tools: $(TOOLS) $(GOLANGCI_LINT)
$(TOOLS): tools/go.mod tools/go.sum
	cd tools && GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto
$(GOLANGCI_LINT): tools/go.mod tools/go.sum
	cd tools && GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint

## generate: format the protos and regenerate pkg/api
generate: $(TOOLS)
	$(BUF) format -w
	$(BUF) generate

## check-generated: fail when pkg/api is not what buf generates from proto/, or the protos are
## not buf-formatted (compares with the working tree, so it also works before a commit)
check-generated: $(TOOLS)
	@$(BUF) format -d --exit-code || (echo "protos are not buf-formatted: run make generate"; exit 1)
	@rm -rf .generated-before && cp -r pkg/api .generated-before
	@$(BUF) generate
	@diff -r .generated-before pkg/api > /dev/null || (rm -rf .generated-before; echo "generated code was stale (now regenerated): commit pkg/api"; exit 1)
	@rm -rf .generated-before
	@echo "generated code is current"

## lint: no tracked file over 512 KiB (tools/check-size.sh), golangci-lint (.golangci.yml: depguard, forbidigo, staticcheck, errorlint, gocritic,
## gofmt, ...), buf lint and format, breaking-change check against main, vet (CI runs this)
lint: $(TOOLS) $(GOLANGCI_LINT)
	tools/check-size.sh
	$(GOLANGCI_LINT) run ./...
	$(BUF) lint
	$(BUF) format -d --exit-code
	$(MAKE) breaking
	$(GO) vet ./...

## breaking: buf breaking-change check against the main branch
breaking: $(TOOLS)
	@if git rev-parse --verify -q main >/dev/null; then $(BUF) breaking --against '.git#branch=main'; else echo "no main branch to compare against"; fi

## up: build the image and start the compose stack (mesh, NATS, Redis, Qdrant, Prometheus, Grafana, Jaeger)
up:
	docker compose up --build -d

## down: stop the compose stack (volumes are kept; docker compose down -v drops them)
down:
	docker compose down

clean:
	rm -rf $(BIN)

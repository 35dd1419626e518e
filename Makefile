# hpcobs entry points. Every target sets up what it needs (as root on Debian 12+): see scripts/setup.sh.
#   make lab        simulated GPU cluster in containers, deployed by playbooks/site.yml
#   make test       lint + unit tests + every Molecule scenario; one-line summary at the end
#   make bundle     offline bundle from the upstream release hosts (connected machine)
SHELL := /bin/sh
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export HPCOBS_TOOLS_BIN := $(CURDIR)/.cache/tools/bin
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

SCENARIOS ?=
BUNDLE ?=
BUNDLE_ARGS ?=
NODE ?= gpu01
GPU ?= 0
FAULT ?= ecc-dbe
CODE ?=

.PHONY: help setup doctor images tools bundle bundle-local bundle-verify unbundle lab lab-down lab-fault lab-jobs lab-report lab-status \
        test lint unit molecule bench bench-deploy bench-deploy-smoke bench-cardinality \
        bench-mgmt bench-mgmt-smoke bench-smoke bench-modules

help:
	@sed -n 's/^#   //p' Makefile
	@echo "Other targets: setup doctor images tools bundle-local bundle-verify unbundle lab-down lab-fault lab-jobs lab-report lab-status lint unit molecule bench bench-deploy bench-deploy-smoke bench-cardinality bench-mgmt bench-mgmt-smoke bench-smoke bench-modules"

setup:
	@scripts/setup.sh

# Prove in seconds that this machine can run the lab and the tests (each failure names its fix).
doctor: setup
	@python3 scripts/doctor.py

images: setup
	@scripts/build-images.sh

tools: setup
	@python3 scripts/local-mirror/build.py tools --out .cache/tools/bin

bundle: setup
	@scripts/bundle.sh upstream $(BUNDLE_ARGS)

bundle-local: setup
	@scripts/bundle.sh local $(BUNDLE_ARGS)

# Check an unpacked bundle (default: files/bundle): signature, SHA256SUMS, manifest, every file's sha256.
bundle-verify:
	@python3 scripts/bundle-tool.py verify $${HPCOBS_BUNDLE_DIR:-files/bundle}

# Unpack a carried bundle (make unbundle BUNDLE=/media/hpcobs-bundle-YYYYMMDD.tar.gz) into files/bundle, verified.
unbundle:
	@scripts/unbundle.sh "$(BUNDLE)"

lab: setup
	@scripts/lab.sh up

lab-down:
	@scripts/lab.sh down

lab-status:
	@scripts/lab.sh status

lab-fault:
	@scripts/lab.sh fault "$(NODE)" "$(GPU)" "$(FAULT)" "$(CODE)"

lab-jobs:
	@scripts/lab.sh jobs

# hpcobs-report (month to date) and the executive board as PNG files from the lab's VictoriaMetrics: .cache/lab-report
lab-report:
	@scripts/lab.sh report

test:
	@scripts/test.sh

lint: setup
	@scripts/test.sh lint

unit: setup tools
	@scripts/test.sh unit

molecule: setup
	@scripts/test.sh molecule $(SCENARIOS)

bench: setup
	@scripts/bench.sh

# The GPU-node play on N systemd containers over SSH (make bench-deploy N="10 50 100 200" RUNS=3): first converge,
# no-op rerun, the node_exporter-only baseline; figures in .cache/bench/deploy, plots in docs/performance.
N ?= 10 50
RUNS ?= 1
CONNECTION ?= ssh
bench-deploy: setup
	@scripts/test.sh prepare
	@python3 bench/deploy.py --nodes $(N) --runs $(RUNS) --connection $(CONNECTION)
	@python3 bench/plot.py

bench-deploy-smoke: setup
	@scripts/test.sh prepare
	@python3 bench/deploy.py --smoke

# Series per exporter of one deployed 8-GPU node, served and stored by the real victoria-metrics after the shipped
# scrape-time drops, measured and projected to a reference node, against the budget of 1 500 (docs/performance.md).
bench-cardinality: setup
	@scripts/test.sh prepare
	@python3 bench/cardinality.py

# The management host at NODES simulated 8-GPU nodes (make bench-mgmt NODES=1000 RUNS=3): 24 h of history, live
# scraping with the shipped scrape configuration and rules, every dashboard panel over 24 h, Prometheus from Debian as
# the comparison; figures in .cache/bench/mgmt, plots in docs/performance (docs/performance.md).
NODES ?= 1000
bench-mgmt: setup
	@scripts/test.sh prepare
	@python3 bench/mgmt.py --nodes $(NODES) --runs $(RUNS)
	@python3 bench/mgmt.py report

bench-mgmt-smoke: setup
	@scripts/test.sh prepare
	@python3 bench/mgmt.py --smoke

# CPU of one module run by how Ansible sends it: builtin (AnsiballZ) modules against hpcobs_files (JSONARGS), on
# localhost (about a minute; docs/performance.md).
bench-modules: setup
	@python3 bench/module_cost.py

# The three smoke versions together (make test runs them as one lane): deploy (one node, baseline play), cardinality
# (one node, the full GPU-node play), management host (20 nodes).
bench-smoke: setup
	@scripts/test.sh prepare
	@scripts/test.sh bench

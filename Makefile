# dsec: `make run` sets everything up and starts the embedded server with a demo;
# `make test` sets everything up and runs the tests. Both are idempotent. Run as root.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DSEC := $(VENV)/bin/dsec
STATE_DIR ?= /var/lib/dsec
PORT ?= 7070
APT_PACKAGES := curl runc tini busybox-static erofs-utils iproute2 nftables gcc libc6-dev \
	fuse3 bubblewrap mmdebstrap qemu-system-x86 qemu-utils linux-image-amd64 extlinux \
	syslinux-common fdisk e2fsprogs podman golang-github-containers-common dnsmasq-base buildah skopeo \
	docker-registry apache2-utils
STAMP := $(VENV)/.installed

.PHONY: harbor-venv setup apt venv run serve stop demo test test-fast test-cgroup2 base-images images bench clean

setup: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# the distribution was called dsec before it became dsec-sandbox: drop the old one
	$(PY) -m pip uninstall -q -y dsec 2>/dev/null || true
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

base-images: setup
	@mkdir -p -m 0700 $(STATE_DIR)
	DSEC_STATE_DIR=$(STATE_DIR) $(PY) scripts/build_debian_image.py --state-dir $(STATE_DIR)

# base images, the microvm guest kernel, and sandboxfusion:1 (every SandboxFusion language
# Debian packages; a few GB, the first build takes a while)
images: base-images
	$(PY) -m dsec.node.backends.microvm.guest --out $(STATE_DIR)/microvm/guest
	DSEC_STATE_DIR=$(STATE_DIR) $(PY) scripts/build_debian_image.py --state-dir $(STATE_DIR) \
		--variant sandboxfusion

# The state dir and the log are private (the server keeps them so); the token is printed
# from its 0600 file, only on the run that created it, and never goes into the log.
run: setup base-images
	@mkdir -p -m 0700 $(STATE_DIR) && chmod 0700 $(STATE_DIR)
	@if curl -sf http://127.0.0.1:$(PORT)/healthz >/dev/null 2>&1; then \
		echo "dsec server already running on 127.0.0.1:$(PORT) (log: $(STATE_DIR)/server.log;" \
			"API token in $(STATE_DIR)/token)"; \
	else \
		had_token=$$([ -f $(STATE_DIR)/token ] && echo yes); \
		(umask 077 && touch $(STATE_DIR)/server.log) && chmod 0600 $(STATE_DIR)/server.log; \
		echo "starting dsec server on 127.0.0.1:$(PORT) (log: $(STATE_DIR)/server.log)"; \
		nohup $(PY) -m dsec.gateway.server --state-dir $(STATE_DIR) --port $(PORT) \
			>>$(STATE_DIR)/server.log 2>&1 & echo $$! > $(STATE_DIR)/server.pid; \
		for i in $$(seq 1 120); do curl -sf http://127.0.0.1:$(PORT)/healthz >/dev/null 2>&1 && break; sleep 0.5; done; \
		if [ -z "$$had_token" ] && [ -f $(STATE_DIR)/token ]; then \
			echo "new API token (kept in $(STATE_DIR)/token, mode 0600): $$(cat $(STATE_DIR)/token)"; \
		else \
			echo "API token: in $(STATE_DIR)/token"; \
		fi; \
	fi
	DSEC_STATE_DIR=$(STATE_DIR) $(DSEC) demo
	@echo
	@echo "The server keeps running. Try:"
	@$(if $(filter-out /var/lib/dsec,$(STATE_DIR)),echo "  export DSEC_STATE_DIR=$(STATE_DIR)",true)
	@echo '  ID=$$($(DSEC) create); $(DSEC) ls; $(DSEC) exec $$ID -- uname -a; $(DSEC) shell $$ID'
	@echo "  $(PY) -c \"import dsec; print(dsec.Client().create().exec('echo hi').stdout)\""
	@echo "Stop it with: make stop"

serve: setup
	$(PY) -m dsec.gateway.server --state-dir $(STATE_DIR) --port $(PORT)

stop:
	@if [ -f $(STATE_DIR)/server.pid ]; then kill $$(cat $(STATE_DIR)/server.pid) 2>/dev/null || true; rm -f $(STATE_DIR)/server.pid; fi

# Harbor needs Python >= 3.12 (dsec's venv is 3.11): a venv of its own for
# tests/integrations/test_harbor.py. The first python3.12/3.13 that runs is taken: on the
# PATH, else the newest one pyenv has installed (its shims fail for versions not selected).
HARBOR_VENV := .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.installed
harbor-venv: $(HARBOR_STAMP)

$(HARBOR_STAMP): pyproject.toml
	@py=""; for v in 3.12 3.13; do \
		if python$$v -c "" 2>/dev/null; then py=$$(command -v python$$v); break; fi; \
		pv=$$(pyenv latest $$v 2>/dev/null) && p=$$(pyenv prefix "$$pv" 2>/dev/null) && \
		"$$p/bin/python$$v" -c "" 2>/dev/null && { py=$$p/bin/python$$v; break; }; \
	done; \
	if [ -z "$$py" ]; then echo "no python3.12 or 3.13: tests/integrations/test_harbor.py will fail"; exit 0; fi; \
	echo "making $(HARBOR_VENV) with $$py"; \
	rm -rf $(HARBOR_VENV) && $$py -m venv $(HARBOR_VENV) && \
	$(HARBOR_VENV)/bin/pip install -q 'harbor==0.26.0' -e . && touch $(HARBOR_STAMP)

test: setup harbor-venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# cgroup v2 only, proven on a real kernel: this host is hybrid (v1 controllers), production
# hosts are v2 only. Decision: QEMU directly (microvm machine, TCG), not the vm backend: it
# boots the Debian kernel of linux-image-amd64 (the microvm guests' kernel, 6.1) with
# cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1, and the guest's root is this host's
# own root shared read-only over virtio-9p under a tmpfs overlay, so the checkout, the venv,
# runc and the kernel modules are at the same paths with nothing to install or copy. Inside:
# cgroup2 alone on /sys/fs/cgroup (checked: stat -fc %T says cgroup2fs), then pytest on the
# container lifecycle, limits, isolation and density tests with real runc (the set is
# tests/support/cgroup2_guest.py DEFAULT_TESTS; pytest args after ARGS= replace it).
# Exits with pytest's status. 7 to 8.5 minutes here (TCG, 2 vCPUs, shared machine); CI runs it
# after `make test` (.ci/run).
test-cgroup2: setup
	PYTHONPATH=$(CURDIR)/src:$(CURDIR) $(PY) -m tests.support.cgroup2_guest $(ARGS)

bench: setup
	@for b in benchmarks/bench_*.py; do case $$b in *_common.py) continue;; esac; \
		echo "== $$b"; $(PY) $$b || exit 1; done
	$(PY) benchmarks/assemble.py

clean: stop
	rm -rf $(VENV) $(HARBOR_VENV) build

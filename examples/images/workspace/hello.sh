#!/bin/sh
# Installed by examples/images/workspace.toml; GREETING comes from the image's env.
echo "${GREETING:-hello}"

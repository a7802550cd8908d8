#!/usr/bin/env bash
# Session 24's planned first call for issue 13. NOT RUN in session 24 (226 s of device time left, under the 4 minutes
# a start needs). Session 25 ran it unchanged as ../s25-call1/call.sh, whose header keeps the preparation steps.
exec bash "$(dirname "$0")/../s25-call1/call.sh" "$@"

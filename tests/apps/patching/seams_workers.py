"""The engines of the seams deploys for `durable worker --app ...:v1` / `...:v2`: each with
the separate application database named by SEAMS_APP_DATABASE_URL. Only a worker process
imports this module (the engines read the environment when built)."""

from __future__ import annotations

import durable
from tests.apps.patching import seams, seams_v1, seams_v2

v1 = durable.Engine(registry=seams_v1.registry, app_database_url=seams.app_database_url())
v2 = durable.Engine(registry=seams_v2.registry, app_database_url=seams.app_database_url())

"""The dashboard JSON against the schema of a pinned Grafana (11.6.0), as TypeScript type checks.

Grafana publishes its dashboard schema as the npm package ``@grafana/schema``: TypeScript types
generated from the CUE kinds (the dashboard, and each panel plugin's options and field config).
The checked-in JSON is written into a TypeScript file as typed constants — the whole dashboard as
``Dashboard``, and each panel's ``options`` and ``fieldConfig.defaults.custom`` as its plugin's
``Options`` / ``FieldConfig`` — and ``tsc --strict`` checks it: a missing required field, a wrong
type or an unknown property (TypeScript's excess-property check on object literals) fails.

The packages are installed once into ``.tools/grafana-schema-<version>/`` (gitignored) with npm.
"""

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from monitoring import dashboard

ROOT = Path(__file__).resolve().parents[2]
GRAFANA_SCHEMA = "11.6.0"  # the Grafana the SDK pin (grafana-foundation-sdk ...!11.6.0) targets
TYPESCRIPT = "5.7.3"  # the TypeScript @grafana/schema 11.6.0 is built with
TOOLS = ROOT / ".tools" / f"grafana-schema-{GRAFANA_SCHEMA}"
PANELCFG = "@grafana/schema/dist/esm/raw/composable/{plugin}/panelcfg/x/{name}PanelCfg_types.gen"
# panel type -> (module alias, module, has a FieldConfig type)
PLUGINS = {
    "timeseries": ("TimeSeries", PANELCFG.format(plugin="timeseries", name="TimeSeries"), True),
    "stat": ("Stat", PANELCFG.format(plugin="stat", name="Stat"), False),
    "heatmap": ("Heatmap", PANELCFG.format(plugin="heatmap", name="Heatmap"), True),
}


def _installed_version(package: str) -> str | None:
    manifest = TOOLS / "node_modules" / package / "package.json"
    return json.loads(manifest.read_text())["version"] if manifest.exists() else None


@pytest.fixture(scope="module")
def tsc() -> Path:
    """``tsc`` of the pinned TypeScript, beside the pinned ``@grafana/schema`` (installed on first use)."""
    if _installed_version("@grafana/schema") != GRAFANA_SCHEMA or _installed_version("typescript") != TYPESCRIPT:
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is not installed: `apt-get install npm` (the schema check installs "
                        f"@grafana/schema@{GRAFANA_SCHEMA} and typescript@{TYPESCRIPT} with it)", pytrace=False)
        TOOLS.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(TOOLS),
             f"@grafana/schema@{GRAFANA_SCHEMA}", f"typescript@{TYPESCRIPT}"],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"npm install failed:\n{proc.stdout}\n{proc.stderr}"
    return TOOLS / "node_modules" / ".bin" / "tsc"


# Prometheus' query type lives in Grafana's Prometheus datasource plugin, not in @grafana/schema:
# its fields (public/app/plugins/datasource/prometheus types, Grafana 11.6) are declared here, over
# the schema's DataQuery (refId, hide, datasource ...), so each target is checked too.
PROM_QUERY = """
type PromQuery = DataQuery & {
  expr: string; legendFormat?: string; instant?: boolean; range?: boolean; exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap'; interval?: string; intervalFactor?: number;
  editorMode?: 'code' | 'builder';
};
"""


def _typescript(data: dict[str, object]) -> str:
    """A TypeScript module declaring ``data`` as a Grafana ``Dashboard`` and each panel's plugin config."""
    lines = ["import type { AnnotationQuery, Dashboard, DataQuery } from '@grafana/schema';"]
    lines += [f"import type * as {alias} from '{module}';" for alias, module, _ in PLUGINS.values()]
    # JSON spells a TypeScript string enum by its value: Json<T> turns each string enum into the
    # union of its values (`${E}`) and keeps everything else (objects, optionality, numbers) as is.
    lines.append("type Json<T> = T extends string ? `${T}` : T extends readonly (infer U)[] ? Json<U>[]"
                 " : T extends object ? { [K in keyof T]: Json<T[K]> } : T;")
    lines.append(PROM_QUERY)
    # The dashboard's annotations are Prometheus annotations: AnnotationQuery<PromQuery>.
    lines.append("type PromDashboard = Omit<Dashboard, 'annotations'> & "
                 "{ annotations?: { list?: AnnotationQuery<PromQuery>[] } };")
    lines.append(f"export const dashboard: Json<PromDashboard> = {json.dumps(data, indent=1)};")
    panels = data.get("panels", [])
    assert isinstance(panels, list)
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["type"] in PLUGINS, f"panel {p['title']!r}: type {p['type']!r} has no schema check; add it to PLUGINS"
        alias, _, has_field_config = PLUGINS[p["type"]]
        lines.append(f"export const options_{p['id']}: Json<{alias}.Options> = {json.dumps(p['options'])};")
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if has_field_config and custom is not None:
            lines.append(f"export const custom_{p['id']}: Json<{alias}.FieldConfig> = {json.dumps(custom)};")
        lines.append(f"export const targets_{p['id']}: PromQuery[] = {json.dumps(p['targets'])};")
    return "\n".join(lines) + "\n"


def _check(tsc: Path, data: dict[str, object], name: str) -> subprocess.CompletedProcess[str]:
    # The file sits under TOOLS so that `@grafana/schema` resolves from its node_modules.
    work = TOOLS / "check"
    work.mkdir(exist_ok=True)
    source = work / f"{name}.ts"
    source.write_text(_typescript(data))
    return subprocess.run(
        [str(tsc), "--noEmit", "--strict", "--skipLibCheck", "--target", "es2022", "--module", "commonjs",
         "--moduleResolution", "node", str(source)],
        capture_output=True, text=True, timeout=300,
    )


def test_dashboard_json_validates_against_grafana_schema(tsc: Path) -> None:
    data = json.loads(dashboard.OUTPUT.read_text())
    proc = _check(tsc, data, "dashboard")
    assert proc.returncode == 0, (
        f"{dashboard.OUTPUT.relative_to(ROOT)} does not match @grafana/schema {GRAFANA_SCHEMA}:\n{proc.stdout}"
    )


def _mistyped_field(data: dict) -> str:  # type: ignore[type-arg]
    data["graphTooltip"] = "crosshair"  # DashboardCursorSync is a number (0, 1, 2)
    return "DashboardCursorSync"


def _unknown_property(data: dict) -> str:  # type: ignore[type-arg]
    data["refreshInterval"] = "30s"  # no such dashboard property (it is `refresh`)
    return "refreshInterval"


def _bad_panel_option(data: dict) -> str:  # type: ignore[type-arg]
    panel = next(p for p in data["panels"] if p["type"] == "timeseries")
    panel["options"]["legend"]["displayMode"] = "sideways"
    return "sideways"


def _query_without_expr(data: dict) -> str:  # type: ignore[type-arg]
    panel = next(p for p in data["panels"] if p["type"] == "stat")
    panel["targets"][0]["query"] = panel["targets"][0].pop("expr")
    return "expr"


@pytest.mark.parametrize("break_it", [_mistyped_field, _unknown_property, _bad_panel_option, _query_without_expr])
def test_schema_check_refuses_a_wrong_dashboard(tsc: Path, break_it: Callable[[dict], str]) -> None:  # type: ignore[type-arg]
    # The same check fails, naming the culprit, on a dashboard broken in one place.
    data = json.loads(dashboard.OUTPUT.read_text())
    culprit = break_it(data)
    proc = _check(tsc, data, break_it.__name__.strip("_"))
    assert proc.returncode != 0
    assert culprit in proc.stdout, proc.stdout

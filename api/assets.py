"""Front-end assets served by the app itself: the machines may have no internet, so no CDN anywhere."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
TEMPLATE_DIR = Path(__file__).parent / "templates"
CACHE_FOR_A_DAY = {"Cache-Control": "public, max-age=86400"}


def plotly_js_path() -> Path:
    """The plotly Python package ships the full plotly.js bundle it embeds in offline figures.
    Imported here, not at the top: only the dashboard's script needs the package (9.7 MB), so
    the rest of the app imports where it is absent, as on a GPU host that runs only tuning."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def swagger_dir() -> Path:
    """swagger-ui-py bundles Swagger UI 5 (which reads OpenAPI 3.1, as FastAPI writes it)."""
    return Path(str(importlib.resources.files("swagger_ui") / "static"))


def install_assets(app: FastAPI) -> None:
    plotly_js_file = plotly_js_path()
    app.mount("/static/swagger", StaticFiles(directory=swagger_dir()), name="swagger")
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(plotly_js_file, media_type="text/javascript", headers=CACHE_FOR_A_DAY)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="/static/favicon.svg",
            # validatorUrl None: no badge fetched from validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None, "defaultModelsExpandDepth": 0},
        )

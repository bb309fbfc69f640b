//! `POST /run/{namespace}/{pod}/{container}?cmd=…`: kubelet's non-streaming exec
//! (`pkg/kubelet/server/server.go getRun` → `RunInContainer`, the runtime's `ExecSync`). The
//! command (`cmd`, split on white space as `strings.Fields` does) runs in the built-in set
//! ([`super::exec`]); its output is the body. A command that exits non-zero is a 500 with
//! the runtime's error (`command '<cmd>' exited with <code>: <output>`); a pod not on this
//! node a 404; a container not running a 500, as `RunInContainer` finds no container.

use std::{collections::HashMap, time::Duration};

use axum::{
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use super::{NodeCtx, exec, pod_here, text_error};

/// The longest a `/run` command may take (`sleep` is the only slow one).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The `/run` handler.
pub(super) async fn run_handler(
    State(ctx): State<NodeCtx>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let cmd = query.get("cmd").map(String::as_str).unwrap_or("");
    let argv: Vec<String> = cmd.split_whitespace().map(str::to_owned).collect();
    if argv.is_empty() {
        return text_error(StatusCode::BAD_REQUEST, "missing cmd");
    }
    let pod = match pod_here(&ctx, &namespace, &pod_name).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container))
        .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if !running {
        return text_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        );
    }
    let mut view = exec::Container::of(&pod, &container);
    let client = ctx.shared.client_for(&ctx.node.name);
    crate::identity::extend(&client, &ctx.shared.tokens, &pod, &container, &mut view).await;
    let Ok((output, code)) =
        tokio::time::timeout(RUN_TIMEOUT, exec::run_to_end(&view, &argv)).await
    else {
        return text_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("command '{cmd}' timed out after {RUN_TIMEOUT:?}"),
        );
    };
    if code != 0 {
        return text_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command '{cmd}' exited with {code}: {}",
                String::from_utf8_lossy(&output)
            ),
        );
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        output,
    )
        .into_response()
}

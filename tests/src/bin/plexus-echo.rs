//! plexus-echo: the least an MCP server can be, for measuring what plexus costs: an
//! rmcp server whose one tool, `echo`, returns its `text`, over stdio or served as
//! streamable HTTP itself. The bench's ratios compare a client calling it directly
//! (over HTTP, and over its own stdio) with the same client calling it through plexus.
//! `--extra-tools N` adds N small tools, for catalog-size figures.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use tokio::task::JoinSet;

#[derive(Parser, Debug)]
#[command(name = "plexus-echo")]
struct Cli {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// Tools besides `echo` (`dummy_0000`…), each answering "ok".
    #[arg(long, value_name = "N", default_value_t = 0)]
    extra_tools: usize,
}

#[derive(Clone)]
struct Echo {
    tools: Arc<Vec<Tool>>,
}

fn schema(property: &str, description: &str) -> Arc<JsonObject> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": { property: { "type": "string", "description": description } },
        "required": [property],
    });
    Arc::new(match schema {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    })
}

impl Echo {
    fn new(extra: usize) -> Echo {
        let mut tools = vec![Tool::new(
            "echo",
            "Echo the given text back unchanged.",
            schema("text", "Text to echo back"),
        )];
        tools.extend((0..extra).map(|n| {
            Tool::new(
                format!("dummy_{n:04}"),
                format!(
                    "Dummy tool number {n}. It exists only to make the tool catalog large; \
                     calling it returns the string ok."
                ),
                schema("x", "Ignored input"),
            )
        }));
        Echo {
            tools: Arc::new(tools),
        }
    }
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("plexus-echo", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items((*self.tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "echo" {
            let text = request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get("text"))
                .and_then(|text| text.as_str())
                .ok_or_else(|| ErrorData::invalid_params("missing string argument `text`", None))?;
            return Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into());
        }
        if self.tools.iter().any(|tool| tool.name == request.name) {
            return Ok(CallToolResult::success(vec![ContentBlock::text("ok")]).into());
        }
        Err(ErrorData::invalid_params(
            Cow::Owned(format!("unknown tool {}", request.name)),
            None,
        ))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let echo = Echo::new(cli.extra_tools);
    let Some(addr) = cli.http else {
        let running = echo.serve(rmcp::transport::stdio()).await?;
        running.waiting().await?;
        return Ok(());
    };
    let service = StreamableHttpService::new(
        move || Ok(echo.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    eprintln!(
        "plexus-echo listening on http://{}/mcp",
        listener.local_addr()?
    );
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = listener.accept().await?;
        // Without it, an event stream's small writes wait out delayed ACKs.
        stream.set_nodelay(true)?;
        let service = service.clone();
        connections.spawn(async move {
            let handler = service_fn(move |request| {
                let service = service.clone();
                async move { Ok::<_, Infallible>(service.handle(request).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), handler)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

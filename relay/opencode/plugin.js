// relay's opencode plugin, written by `relay setup opencode` (re-running it rewrites this file).
// - config: exchanges the folder's credential for this process's agent headers (`relay hook headers`)
//   and puts them on the relay MCP server: no token is stored in any file. opencode runs the config
//   hook once per process, so the headers live relay's exchange lifetime (15 minutes).
// - session.created: starts `relay hook wake-stream`, which registers the relay session and prints one
//   JSON line per batch of new mail; each line becomes a prompt of the session (promptAsync), which
//   starts a turn when the session is idle. One waiter per opencode process: the newest session's.
import { execFileSync, spawn } from "node:child_process";
import { createInterface } from "node:readline";

const RELAY = __RELAY_ARGV__;
const CREDENTIAL_FILE = __CREDENTIAL_FILE__;
const SESSION = `opencode-${process.pid}-${Math.floor(performance.timeOrigin)}`;

function relay(...args) {
  return [RELAY[0], [...RELAY.slice(1), ...args, "--credential-file", CREDENTIAL_FILE, "--session", SESSION]];
}

export const RelayPlugin = async ({ client }) => {
  let waiter = null;
  return {
    config: async (cfg) => {
      const server = cfg.mcp?.relay;
      if (!server) return;
      const [command, args] = relay("hook", "headers");
      const out = execFileSync(command, args, { encoding: "utf8", timeout: 15000 });
      server.headers = { ...(server.headers ?? {}), ...JSON.parse(out) };
    },
    event: async ({ event }) => {
      const info = event.properties?.info;
      if (event.type !== "session.created" || !info?.id || info.parentID) return;
      if (waiter) waiter.kill();
      const [command, args] = relay("hook", "wake-stream");
      waiter = spawn(command, args, { stdio: ["ignore", "pipe", "ignore"] });
      createInterface({ input: waiter.stdout }).on("line", async (line) => {
        let text;
        try {
          text = JSON.parse(line).summary;
        } catch {
          return;
        }
        if (typeof text !== "string") return;
        await client.session.promptAsync({ path: { id: info.id }, body: { parts: [{ type: "text", text }] } });
      });
    },
  };
};

// Node-RED 4.1 settings for hoptrace's reference pipeline (Mosquitto -> Node-RED -> InfluxDB).
//
// infra/nodered/nodered.sh copies this file and flows.json into Node-RED's userDir under
// ${HOPTRACE_RUN:-/tmp/hoptrace-infra}/nodered/userdir on every start and loads it from there.
// Only what differs from Node-RED's defaults, or what a reader should not have to guess, is set.
const path = require("path");

module.exports = {
    // The flow: nodered.sh copies infra/nodered/flows.json beside this copy of the settings on
    // every start, so edits made in the editor last until the next start only. An absolute
    // path: Node-RED would look for a relative one in its working directory first.
    flowFile: path.join(__dirname, "flows.json"),
    flowFilePretty: true,
    // The flow has no credentials; nothing to encrypt.
    credentialSecret: false,

    // Editor and admin HTTP API on loopback only.
    uiHost: "127.0.0.1",
    uiPort: Number(process.env.HOPTRACE_NR_PORT || 11880),

    // No outbound requests: no telemetry or update check, no diagnostics page, no palette
    // installs, no npm installs from function nodes.
    telemetry: { enabled: false, updateNotification: false },
    diagnostics: { enabled: false, ui: false },
    externalModules: {
        autoInstall: false,
        palette: { allowInstall: false, allowUpdate: false, allowUpload: false },
        modules: { allowInstall: false },
    },
    functionExternalModules: false,
    editorTheme: { projects: { enabled: false } },

    // Reconnect to a restarted Mosquitto within a second (default 15 s).
    mqttReconnectTime: 1000,

    logging: {
        console: { level: "info", metrics: false, audit: false },
    },
};

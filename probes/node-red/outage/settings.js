'use strict';
// Node-RED 4.1 settings of the outage host (probes/node-red/outage-host.sh), loaded in
// place with --settings; the userDir (-u) is the launcher's, and flows.json in it is what
// outage/flow.js printed. The generator's settings come from the launcher's environment
// (HOPTRACE_OUTAGE_RATE, _STREAMS, _DURATION, _PROBE_PKG, _REMOVE_USERDIR; see host.js).
// Otherwise as infra/nodered/settings.js: loopback only, nothing fetched from outside.

module.exports = {
  // Relative to the userDir.
  flowFile: 'flows.json',
  // The flow has no credentials; nothing to encrypt.
  credentialSecret: false,

  uiHost: '127.0.0.1',

  telemetry: { enabled: false, updateNotification: false },
  diagnostics: { enabled: false, ui: false },
  externalModules: {
    autoInstall: false,
    palette: { allowInstall: false, allowUpdate: false, allowUpload: false },
    modules: { allowInstall: false },
  },
  functionExternalModules: false,
  editorTheme: { projects: { enabled: false } },

  logging: {
    console: { level: 'info', metrics: false, audit: false },
  },

  // The flow's function nodes reach the generator and sink through the global context.
  functionGlobalContext: {
    hoptraceOutage: require('./host').fromEnv(process.env),
  },
};

// Entry of the vendored bundle: the graph-layout libraries the pages use, nothing else.
// scripts/build_web.sh bundles this into service/web/static/vendor.js (committed).
import cytoscape from "cytoscape";
import cytoscapeDagre from "cytoscape-dagre";

cytoscape.use(cytoscapeDagre);

export { cytoscape };
// Filled in by esbuild's --define from web/package.json, so a test can check the bundle.
export const versions = VENDOR_VERSIONS;

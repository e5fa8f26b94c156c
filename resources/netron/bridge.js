// qb Studio overlay for the embedded Netron: selection and context-menu events to Python, status
// colours, selection from Python, readiness. Netron's internals used here are unversioned: the
// netron package is pinned and tests/gui/test_graph_view.py checks each of them.
// Body of an injected user script (DocumentCreation, main world). qbstudio/netron/scripts.py wraps it
// in try/catch and defines qbPost(event, data) and qbGuard(where, fn).

const NODE_PREFIX = 'node-name-';
const STATUS_PREFIX = 'qb-status-';
const SVG_NS = 'http://www.w3.org/2000/svg';
const state = { statuses: {}, tooltips: {}, heat: null, heatTips: {}, opened: false, message: '' };
const HEAT_CLASS = 'qb-heat';
const NO_HEAT = ['#d5d5d5', '#444444'];

const currentFile = () => {
    const meta = document.querySelector('meta[name="file"]');
    return meta ? meta.getAttribute('content') : '';
};

const setTooltip = (element, tooltip) => {
    const previous = element.querySelector(':scope > title.qb-tooltip');
    if (previous) {
        previous.remove();
    }
    if (tooltip) {
        const title = document.createElementNS(SVG_NS, 'title');
        title.setAttribute('class', 'qb-tooltip');
        title.textContent = tooltip;
        element.insertBefore(title, element.firstChild);
    }
};

// Heat colours are inline styles on the node's header (they win over the status classes' CSS).
const setHeat = (element, colours) => {
    const header = element.querySelector(':scope > g.node-item-type > path');
    const text = element.querySelector(':scope > g.node-item-type > text');
    const border = element.querySelector(':scope > path.node-border');
    if (header) {
        header.style.fill = colours ? colours[0] : '';
    }
    if (text) {
        text.style.fill = colours ? colours[1] : '';
    }
    if (border) {
        border.style.stroke = colours ? colours[0] : '';
    }
    element.classList.toggle(HEAT_CLASS, Boolean(colours));
};

const paintNode = (element) => {
    const name = element.id.substring(NODE_PREFIX.length);
    for (const cls of Array.from(element.classList)) {
        if (cls.startsWith(STATUS_PREFIX)) {
            element.classList.remove(cls);
        }
    }
    if (state.heat) {
        const colours = state.heat[name];
        setHeat(element, colours || NO_HEAT);
        setTooltip(element, state.heatTips[name] || (colours ? '' : name + ': no value for this layer'));
        return colours ? 1 : 0;
    }
    if (element.classList.contains(HEAT_CLASS)) {
        setHeat(element, null);
    }
    setTooltip(element, '');
    const status = state.statuses[name];
    if (!status) {
        return 0;
    }
    element.classList.add(STATUS_PREFIX + status);
    setTooltip(element, state.tooltips[name]);
    return 1;
};

const paintAll = () => {
    let painted = 0;
    for (const element of document.querySelectorAll(`g[id^="${NODE_PREFIX}"]`)) {
        painted += paintNode(element);
    }
    return painted;
};

// Python -> page: colour nodes by support status; returns how many rendered nodes got a status.
window.qbSetStatuses = qbGuard('qbSetStatuses', (statuses, tooltips) => {
    state.statuses = statuses || {};
    state.tooltips = tooltips || {};
    document.documentElement.toggleAttribute('data-qb-statuses', Object.keys(state.statuses).length > 0);
    return paintAll();
});

// Python -> page: colour nodes by a value (error heatmap): {name: [fill, text colour]} and tooltips; null
// goes back to the support colours. Returns how many rendered nodes got a heat colour.
window.qbSetHeat = qbGuard('qbSetHeat', (colours, tooltips) => {
    state.heat = colours || null;
    state.heatTips = tooltips || {};
    document.documentElement.toggleAttribute('data-qb-heat', Boolean(state.heat));
    return paintAll();
});

// Python -> page: select a node by name and scroll it into view; false if it is not in the graph.
window.qbSelect = qbGuard('qbSelect', (name, behavior) => {
    const view = window.__view__;
    const graph = view ? view.activeTarget : null;
    const target = view ? view.target : null;
    if (!graph || !target || !Array.isArray(graph.nodes)) {
        return false;
    }
    const node = graph.nodes.find((candidate) => candidate && candidate.name === name);
    const elements = node ? target.select([node], 'qbstudio') : null;
    if (!elements || elements.length === 0) {
        return false;
    }
    target.scrollTo(elements, behavior || 'smooth');
    return true;
});

// Page -> Python: a node chosen in Netron's Find sidebar is selected with source 'sidebar' (no
// showNodeProperties call): report it like a click. Selections from Python use another source.
const hookTarget = (target) => {
    if (!target || target.__qbHooked || typeof target.select !== 'function') {
        return;
    }
    target.__qbHooked = true;
    const select = target.select;
    target.select = function (selection, source) {
        const result = select.apply(this, arguments);
        qbGuard('sidebarSelect', () => {
            const node = Array.isArray(selection) && selection.length === 1 ? selection[0] : null;
            if (source === 'sidebar' && node && node.type && node.name) {
                qbPost('select', { node: String(node.name), source: 'find' });
            }
        })();
        return result;
    };
};

// Page -> Python: Netron shows a node's properties when the user clicks (or activates) it.
const hookView = (view) => {
    const showNodeProperties = view.showNodeProperties;
    view.showNodeProperties = function (node, source) {
        qbGuard('showNodeProperties', () => {
            qbPost('select', { node: node && node.name ? String(node.name) : '', source: String(source || '') });
        })();
        return showNodeProperties.apply(this, arguments);
    };
    // Expanding a block or entering a subgraph renders again: keep the colours.
    const render = view.render;
    view.render = async function () {
        const result = await render.apply(this, arguments);
        qbGuard('render', paintAll)();
        qbGuard('hookTarget', hookTarget)(view.target);
        return result;
    };
};

let currentView;
Object.defineProperty(window, '__view__', {
    configurable: true,
    get: () => currentView,
    set: (value) => {
        currentView = value;
        if (value) {
            qbGuard('hookView', hookView)(value);
        }
    }
});

// Page -> Python: right click on a node (for a per-layer context menu in the workbench).
document.addEventListener('contextmenu', qbGuard('contextmenu', (event) => {
    const element = event.target && event.target.closest ? event.target.closest(`g[id^="${NODE_PREFIX}"]`) : null;
    if (element) {
        event.preventDefault();
        qbPost('context', { node: element.id.substring(NODE_PREFIX.length), x: event.clientX, y: event.clientY });
    }
}), true);

// Page -> Python: model parsed (node count, before the slow layout), graph shown, or a message Netron
// shows: an error ('alert'), a dialog it waits on, or a "layout takes long" notice with a Cancel button.
const poll = qbGuard('poll', () => {
    const body = document.body;
    if (!body) {
        return;
    }
    const view = window.__view__;
    const graph = view ? view.activeTarget : null;
    if (!state.opened && graph && Array.isArray(graph.nodes)) {
        state.opened = true;
        qbPost('opened', { file: currentFile(), nodes: graph.nodes.length });
    }
    const rendered = document.querySelectorAll('g[id^="node-"]').length;
    if (body.classList.contains('default') && rendered > 0) {
        window.clearInterval(timer);
        qbPost('ready', { file: currentFile(), nodes: rendered, painted: paintAll() });
        return;
    }
    const text = document.getElementById('message-text');
    const button = document.getElementById('message-button');
    const kind = body.classList.contains('alert') ? 'alert' : body.classList.contains('notification') ? 'notification' : '';
    const message = kind && text ? text.innerText.trim() : '';
    if (message !== state.message) {
        state.message = message;
        if (message) {
            const action = button && button.style.display !== 'none' ? button.innerText.trim() : '';
            qbPost('message', { file: currentFile(), text: message, kind: kind, button: action });
        }
    }
});
const timer = window.setInterval(poll, 50);

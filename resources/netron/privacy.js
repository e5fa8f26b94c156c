// qb Studio overlay for the embedded Netron: keep it offline and free of dialogs.
// Body of an injected user script (DocumentCreation, main world). qbstudio/netron/scripts.py wraps it
// in try/catch and defines qbPost(event, data) and qbGuard(where, fn).

// A custom URL scheme has no cookies, so Netron would show its consent dialog (after trying an
// IP-lookup service) on every load and never open the model. Report that consent was given.
try {
    Object.defineProperty(Document.prototype, 'cookie', {
        configurable: true,
        get: () => 'consent=1',
        set: () => {}
    });
} catch (error) {
    qbPost('script-error', { where: 'cookie', message: String(error) });
}

// Netron reports usage and errors with navigator.sendBeacon. Chromium already refuses http(s) from
// this local scheme, but keep the attempt from ever leaving the page, and record it for tests.
try {
    const suppressed = [];
    Object.defineProperty(window, '__qbSuppressedBeacons', { value: suppressed });
    Object.defineProperty(Navigator.prototype, 'sendBeacon', {
        configurable: true,
        writable: true,
        value: qbGuard('sendBeacon', (url) => {
            suppressed.push(String(url));
            qbPost('beacon', { url: String(url) });
            return true;
        })
    });
} catch (error) {
    qbPost('script-error', { where: 'sendBeacon', message: String(error) });
}

// The graph view works offline. Refuse fetch/XMLHttpRequest to anything but this app's own scheme
// in the page itself, and report the attempt (the request interceptor is the second line).
try {
    const isLocal = (url) => {
        try {
            return ['qbnetron:', 'data:', 'blob:'].includes(new URL(String(url), document.baseURI).protocol);
        } catch (error) {
            return false;
        }
    };
    const refuse = (url) => qbPost('request-blocked', { url: String(url) });
    const fetch = window.fetch;
    window.fetch = function (resource) {
        const url = resource && resource.url ? resource.url : String(resource);
        if (!isLocal(url)) {
            refuse(url);
            return Promise.reject(new TypeError('Network access is disabled in qb Studio.'));
        }
        return fetch.apply(this, arguments);
    };
    const open = XMLHttpRequest.prototype.open;
    XMLHttpRequest.prototype.open = function (method, url) {
        if (!isLocal(url)) {
            refuse(url);
            throw new DOMException('Network access is disabled in qb Studio.', 'NetworkError');
        }
        return open.apply(this, arguments);
    };
} catch (error) {
    qbPost('script-error', { where: 'network guard', message: String(error) });
}

// A real OpenID provider for the single sign-on tests: oidc-provider (installed by
// scripts/ensure-idp into target/idp-tools) on loopback, issuing JWT access tokens
// for one resource indicator (plexus's audience). Logins go through its interaction
// flow: a form asking for the account (alice or bob), consent granted at once.
//
//   node tests/idp/provider.mjs --port PORT --audience URL [--alg RS256|ES256|EdDSA]
//
// Prints `listening on http://127.0.0.1:PORT` once bound. A new signing key (and
// kid) is made at every start: restarting on the same port rotates the keys.
// IDP_ACCESS_TTL (seconds, default 600) sets the access tokens' lifetime; with
// IDP_REFRESH=1 every code grant to a client allowed `refresh_token` gets a
// refresh token (else only with offline_access and consent, oidc-provider's rule).
// Test-only routes: POST /test/mint signs a token with the current key from a JSON
// body ({sub, aud, iss, exp_in, nbf_in, groups, kid}); GET /test/jwks-count says
// how often the key set was fetched; POST /test/revoke-refresh destroys every
// refresh token issued so far (their next use gets invalid_grant); POST
// /test/token-audience ({audience}) sets the `aud` of the access tokens issued
// from then on (the resource indicator asked for stays the same); GET
// /test/token-requests counts the token endpoint's requests by grant_type.
// GET /test/registrations counts the dynamic client registrations; POST
// /test/forget-clients deletes every client registered so far (its next token
// request gets invalid_client). POST /test/token-fail ({grant_type, count,
// status, error, drop}) makes the next `count` token requests of that grant type
// answer `status` with `{error}` (a plain-text body when `error` is absent), or,
// with `drop: true`, go unanswered: their connection is closed.
// The device grant's polling (RFC 8628 §3.5), which oidc-provider leaves to the
// deployment: with IDP_DEVICE_INTERVAL (seconds) its answers carry that
// `interval`, and a poll sooner than a code's interval after its last one gets
// `slow_down`, which adds 5 s to that code's interval. POST /test/device
// ({slow_down_first, complete, expires_in}) applies to the codes issued from then
// on: their first poll gets `slow_down` (a server under load), `complete: false`
// leaves out `verification_uri_complete`, and `expires_in` is the lifetime their
// answer states; GET /test/device-polls lists each code's polls
// ({at_ms, answer}).
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import http from 'node:http';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, arg, i, all) => {
    if (arg.startsWith('--')) pairs.push([arg.slice(2), all[i + 1]]);
    return pairs;
  }, []),
);
const port = Number(args.port);
const audience = args.audience;
const alg = args.alg ?? 'RS256';
const accessTtl = Number(process.env.IDP_ACCESS_TTL ?? 600);
const alwaysRefresh = process.env.IDP_REFRESH === '1';
if (!port || !audience) {
  console.error('usage: provider.mjs --port PORT --audience URL [--alg ALG]');
  process.exit(64);
}
const tools = process.env.IDP_TOOLS ?? path.resolve(import.meta.dirname ?? '.', '../../target/idp-tools');
const require = createRequire(path.join(tools, 'node_modules', 'resolve-from-here.js'));
const load = (name) => import(pathToFileURL(require.resolve(name)).href);
const { default: Provider, errors } = await load('oidc-provider');
const jose = await load('jose');

const issuer = `http://127.0.0.1:${port}`;
const kid = randomUUID();
// The `aud` of the access tokens issued for the resource (POST /test/token-audience).
let tokenAudience = audience;
const { privateKey } = await jose.generateKeyPair(alg, { extractable: true, crv: alg === 'EdDSA' ? 'Ed25519' : undefined });
const privateJwk = { ...(await jose.exportJWK(privateKey)), kid, alg, use: 'sig' };

// The accounts a login may name, and the groups their tokens carry.
const accounts = { alice: ['sre', 'dev'], bob: ['dev'] };

const provider = new Provider(issuer, {
  jwks: { keys: [privateJwk] },
  findAccount: (ctx, sub) => (accounts[sub] ? { accountId: sub, claims: () => ({ sub }) } : undefined),
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    deviceFlow: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => {
        if (resource !== audience) throw new errors.InvalidTarget();
        return { scope: 'mcp', audience: tokenAudience, accessTokenFormat: 'jwt', accessTokenTTL: accessTtl, jwt: { sign: { alg } } };
      },
    },
  },
  extraTokenClaims: (ctx, token) => (token.accountId ? { groups: accounts[token.accountId] ?? [] } : undefined),
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  pkce: { required: () => true },
  ...(alwaysRefresh ? { issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token') } : {}),
  scopes: ['openid', 'offline_access', 'mcp'],
  clientDefaults: { token_endpoint_auth_method: 'none', grant_types: ['authorization_code', 'refresh_token'] },
  enabledJWA: { authorizationSigningAlgValues: [alg], idTokenSigningAlgValues: [alg] },
});

let jwksCount = 0;
const tokenRequests = {};
const deviceInterval = Number(process.env.IDP_DEVICE_INTERVAL ?? 0);
let deviceSettings = { slow_down_first: false, complete: true };
// Per device code: its interval now, its last poll, and every poll's answer.
const devicePolls = new Map();
const refreshTokens = [];
provider.on('refresh_token.saved', (token) => refreshTokens.push(token.jti));
const registeredClients = [];
let registrations = 0;
provider.on('registration_create.success', (ctx, client) => {
  registrations += 1;
  registeredClients.push(client.clientId);
});
// Per grant type: how many token requests still get a forced failure, and which.
const tokenFailures = {};

const readBody = (req) =>
  new Promise((resolve, reject) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => resolve(body));
    req.on('error', reject);
  });

provider.use(async (ctx, next) => {
  if (ctx.path === '/jwks') jwksCount += 1;
  const interaction = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (interaction) {
    const details = await provider.interactionDetails(ctx.req, ctx.res);
    const { prompt, params, session, grantId } = details;
    if (prompt.name === 'login') {
      if (ctx.method === 'GET') {
        ctx.type = 'html';
        ctx.body = `<form method="post" action="/interaction/${details.uid}/login"><input name="login"><button>Sign in</button></form>`;
        return;
      }
      const login = new URLSearchParams(await readBody(ctx.req)).get('login');
      if (!accounts[login]) {
        ctx.status = 400;
        ctx.body = 'no such account';
        return;
      }
      ctx.status = 303;
      ctx.redirect(await provider.interactionResult(ctx.req, ctx.res, { login: { accountId: login } }, { mergeWithLastSubmission: false }));
      return;
    }
    // Consent: everything asked for is granted.
    const grant = grantId
      ? await provider.Grant.find(grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    const id = await grant.save();
    ctx.status = 303;
    ctx.redirect(await provider.interactionResult(ctx.req, ctx.res, { consent: { grantId: id } }, { mergeWithLastSubmission: true }));
    return;
  }
  if (ctx.path === '/test/revoke-refresh' && ctx.method === 'POST') {
    let revoked = 0;
    for (const jti of refreshTokens.splice(0)) {
      const token = await provider.RefreshToken.find(jti, { ignoreExpiration: true });
      if (token) {
        await token.destroy();
        revoked += 1;
      }
    }
    ctx.body = { revoked };
    return;
  }
  if (ctx.path === '/test/token-audience' && ctx.method === 'POST') {
    tokenAudience = JSON.parse(await readBody(ctx.req)).audience;
    ctx.body = { audience: tokenAudience };
    return;
  }
  if (ctx.path === '/device/auth' && ctx.method === 'POST') {
    await next();
    const body = ctx.body;
    if (ctx.status === 200 && body?.device_code) {
      if (deviceInterval) body.interval = deviceInterval;
      if (!deviceSettings.complete) delete body.verification_uri_complete;
      if (deviceSettings.expires_in) body.expires_in = deviceSettings.expires_in;
      devicePolls.set(body.device_code, {
        interval: deviceInterval,
        last: undefined,
        slowDownFirst: deviceSettings.slow_down_first,
        polls: [],
      });
    }
    return;
  }
  if (ctx.path === '/token' && ctx.method === 'POST') {
    // Read here, the form is handed on already parsed (oidc-provider takes it).
    const raw = await readBody(ctx.req);
    ctx.req.body = raw;
    const form = new URLSearchParams(raw);
    const grant = form.get('grant_type');
    tokenRequests[grant] = (tokenRequests[grant] ?? 0) + 1;
    const failure = tokenFailures[grant];
    if (failure?.count > 0) {
      failure.count -= 1;
      if (failure.drop) {
        ctx.respond = false;
        ctx.req.socket.destroy();
        return;
      }
      ctx.status = failure.status ?? 500;
      if (failure.error) ctx.body = { error: failure.error, error_description: 'forced by /test/token-fail' };
      else {
        ctx.type = 'text';
        ctx.body = 'the token service is down';
      }
      return;
    }
    const code = grant === 'urn:ietf:params:oauth:grant-type:device_code' ? devicePolls.get(form.get('device_code')) : undefined;
    if (!code) {
      await next();
      return;
    }
    const now = Date.now();
    const early = code.slowDownFirst || (code.last !== undefined && now - code.last < code.interval * 1000);
    code.slowDownFirst = false;
    code.last = now;
    if (early) {
      code.interval += 5;
      code.polls.push({ at_ms: now, answer: 'slow_down' });
      ctx.status = 400;
      ctx.body = { error: 'slow_down', error_description: `poll at most every ${code.interval} s` };
      return;
    }
    await next();
    code.polls.push({ at_ms: now, answer: ctx.body?.error ?? 'token' });
    return;
  }
  if (ctx.path === '/test/device' && ctx.method === 'POST') {
    deviceSettings = { ...deviceSettings, ...JSON.parse(await readBody(ctx.req)) };
    ctx.body = deviceSettings;
    return;
  }
  if (ctx.path === '/test/device-polls') {
    ctx.body = { codes: [...devicePolls.values()].map(({ polls, interval }) => ({ polls, interval })) };
    return;
  }
  if (ctx.path === '/test/token-fail' && ctx.method === 'POST') {
    const failure = JSON.parse(await readBody(ctx.req));
    tokenFailures[failure.grant_type] = failure;
    ctx.body = failure;
    return;
  }
  if (ctx.path === '/test/registrations') {
    ctx.body = { count: registrations };
    return;
  }
  if (ctx.path === '/test/forget-clients' && ctx.method === 'POST') {
    let forgotten = 0;
    for (const id of registeredClients.splice(0)) {
      await provider.Client.adapter.destroy(id);
      forgotten += 1;
    }
    ctx.body = { forgotten };
    return;
  }
  if (ctx.path === '/test/token-requests') {
    ctx.body = tokenRequests;
    return;
  }
  if (ctx.path === '/test/jwks-count') {
    ctx.body = { count: jwksCount };
    return;
  }
  if (ctx.path === '/test/mint' && ctx.method === 'POST') {
    const claims = JSON.parse(await readBody(ctx.req));
    const now = Math.floor(Date.now() / 1000);
    const payload = { sub: claims.sub, groups: claims.groups ?? [] };
    const jwt = new jose.SignJWT(payload)
      .setProtectedHeader({ alg, kid: claims.kid ?? kid, typ: 'at+jwt' })
      .setIssuer(claims.iss ?? issuer)
      .setAudience(claims.aud ?? audience)
      .setIssuedAt(now)
      .setExpirationTime(now + (claims.exp_in ?? 600))
      .setJti(randomUUID());
    if (claims.nbf_in !== undefined) jwt.setNotBefore(now + claims.nbf_in);
    ctx.body = { token: await jwt.sign(privateKey) };
    return;
  }
  await next();
});

const server = http.createServer(provider.callback());
server.listen(port, '127.0.0.1', () => {
  console.log(`listening on ${issuer} (kid ${kid}, ${alg})`);
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
